package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

func resultWrites(l queue.Lease) *store.Writes {
	w := &store.Writes{}
	w.Exec(`INSERT INTO results (job_id, lease_gen) VALUES ($1, $2)`, l.JobID, l.Gen)
	return w
}

// On every kind of db the writes, the output and the completion commit together; a
// revoked lease writes nothing and is recorded; a write that fails writes nothing, names
// the write, and leaves the job running and unlocked under its lease.
func TestWithLeaseWritesOnEveryKindOfDB(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	for name, db := range leaseDBs(t, b) {
		t.Run(name, func(t *testing.T) {
			b.insert(t, store.InsertParams{Kind: "fenced"})
			l := store.LeaseOf(b.claim(t, "holder", 1, time.Minute)[0])
			how := store.LeaseTx{Complete: true, Output: func() []byte { return []byte(`{"ok":true}`) }}
			if err := store.WithLeaseWrites(b.ctx, db, l, how, resultWrites(l)); err != nil {
				t.Fatalf("commit: %v", err)
			}
			got := b.job(t, l.JobID)
			if got.State != queue.StateCompleted || string(got.Output) != `{"ok": true}` || b.results(t, l.JobID) != 1 {
				t.Fatalf("after commit: %s, output %s, %d result rows", got.State, got.Output, b.results(t, l.JobID))
			}

			b.insert(t, store.InsertParams{Kind: "fenced"})
			stale := store.LeaseOf(b.claim(t, "holder", 1, time.Minute)[0])
			b.expire(t, stale.JobID)
			if revs, err := store.Reap(b.ctx, b.db.Pool, store.ReapParams{}); err != nil || len(revs) != 1 {
				t.Fatalf("reap: %v %v", revs, err)
			}
			staleBefore := b.events(t, queue.EventStaleWriteRejected)
			err := store.WithLeaseWrites(b.ctx, db, stale, store.LeaseTx{Complete: true}, resultWrites(stale))
			if !errors.Is(err, queue.ErrLeaseLost) {
				t.Fatalf("stale commit: %v; want ErrLeaseLost", err)
			}
			if n := b.results(t, stale.JobID); n != 0 {
				t.Fatalf("stale holder wrote %d result rows", n)
			}
			if got := b.events(t, queue.EventStaleWriteRejected); got != staleBefore+1 {
				t.Fatalf("stale_write_rejected events %d, want %d", got, staleBefore+1)
			}
			if got := b.job(t, stale.JobID); got.State != queue.StateAvailable || got.LeaseGen != stale.Gen+1 {
				t.Fatalf("revoked job %s gen %d", got.State, got.LeaseGen)
			}

			b.insert(t, store.InsertParams{Kind: "fenced"})
			l2 := store.LeaseOf(b.claim(t, "holder", 1, time.Minute)[0])
			w := resultWrites(l2)
			w.Exec(`INSERT INTO results (job_id, lease_gen) VALUES ($1, $2)`, l2.JobID, l2.Gen) // a duplicate key
			err = store.WithLeaseWrites(b.ctx, db, l2, store.LeaseTx{Complete: true}, w)
			if err == nil || !store.IsUniqueViolation(err, "results_pkey") || !strings.Contains(err.Error(), "write 2") {
				t.Fatalf("commit with a failing write: %v; want the unique violation of write 2", err)
			}
			if n := b.results(t, l2.JobID); n != 0 {
				t.Fatalf("a failed commit left %d result rows", n)
			}
			// Still running under the same lease, and not locked: the holder completes it.
			if err := store.Complete(b.ctx, b.db.Pool, l2); err != nil {
				t.Fatalf("complete after the failed commit: %v", err)
			}
		})
	}
}

// The whole fenced transaction is one round trip once the connection has the
// statements' descriptions.
func TestWithLeaseWritesOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	conn, counter := countedConn(t, b)
	for i := range 3 {
		l := store.LeaseOf(b.claimOne(t))
		before := counter.n.Load()
		if err := store.WithLeaseWrites(b.ctx, conn, l, store.LeaseTx{Complete: true}, resultWrites(l)); err != nil {
			t.Fatal(err)
		}
		if n := counter.n.Load() - before; n != 1 {
			t.Fatalf("commit %d: %d round trips, want 1", i, n)
		}
		if b.results(t, l.JobID) != 1 || b.job(t, l.JobID).State != queue.StateCompleted {
			t.Fatalf("commit %d did not land", i)
		}
	}
}

// The row lock is taken before the writes run and held until COMMIT: a reaper that
// runs while a write waits, after the lease expired, skips the job, and the commit wins.
func TestWithLeaseWritesHoldOffReaper(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	j := b.insert(t, store.InsertParams{Kind: "fence"})
	l := store.LeaseOf(b.claim(t, "holder", 1, 200*time.Millisecond)[0])

	// The test's own uncommitted insert of a key makes the second write wait on it (a
	// row's transaction lock: the statement is parsed and planned without waiting).
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE gate (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	gate, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gate.Rollback(b.ctx) }()
	if _, err := gate.Exec(b.ctx, `INSERT INTO gate (id) VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	w := resultWrites(l)
	w.Exec(`INSERT INTO gate (id) VALUES (1)`)
	done := make(chan error, 1)
	go func() { done <- store.WithLeaseWrites(b.ctx, b.db.Pool, l, store.LeaseTx{Complete: true}, w) }()

	// Wait until the pipeline waits on the gate, and the lease has expired. On Citus the
	// insert waits on the worker node, whose sessions citus_stat_activity shows (with
	// the statement rewritten for the shard: gate_<shard id>, comments gone).
	activity := "pg_stat_activity"
	if dist, err := store.Distributed(b.ctx, b.db.Pool); err != nil {
		t.Fatal(err)
	} else if dist {
		activity = "citus_stat_activity"
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting, expired bool
		if err := b.db.Pool.QueryRow(b.ctx, `
			SELECT EXISTS (SELECT 1 FROM `+activity+`
			               WHERE query LIKE 'INSERT INTO %gate%' AND wait_event_type = 'Lock'),
			       (SELECT lease_expires_at < now() FROM fenceq_jobs WHERE id = $1)`, j.ID).Scan(&waiting, &expired); err != nil {
			t.Fatal(err)
		}
		if waiting && expired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the commit never waited on the gate with its lease expired (waiting %v, expired %v)", waiting, expired)
		}
		time.Sleep(10 * time.Millisecond)
	}
	revs, err := store.Reap(b.ctx, b.db.Pool, store.ReapParams{})
	if err != nil || len(revs) != 0 {
		t.Fatalf("reaper revoked %+v (%v) while the fenced transaction held the row", revs, err)
	}
	if err := gate.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("fenced commit: %v", err)
	}
	if got := b.job(t, j.ID); got.State != queue.StateCompleted || got.LeaseGen != l.Gen || b.results(t, j.ID) != 1 {
		t.Fatalf("job %s gen %d, %d result rows", got.State, got.LeaseGen, b.results(t, j.ID))
	}
}

// A statement that cannot be prepared fails the commit with the server's error and
// writes nothing.
func TestWithLeaseWritesBadStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	l := store.LeaseOf(b.claimOne(t))
	w := resultWrites(l)
	w.Exec(`INSERT INTO no_such_table VALUES ($1)`, 1)
	err := store.WithLeaseWrites(b.ctx, b.db.Pool, l, store.LeaseTx{Complete: true}, w)
	if err == nil || !strings.Contains(err.Error(), "no_such_table") {
		t.Fatalf("commit with a bad statement: %v; want the server's error naming the table", err)
	}
	if b.results(t, l.JobID) != 0 || b.job(t, l.JobID).State != queue.StateRunning {
		t.Fatalf("a failed commit wrote %d result rows, job %s", b.results(t, l.JobID), b.job(t, l.JobID).State)
	}
	if err := store.Complete(b.ctx, b.db.Pool, l); err != nil {
		t.Fatalf("complete after the failed commit: %v", err)
	}
}
