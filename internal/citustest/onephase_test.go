package citustest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/internal/connstr"
	"github.com/fenceq/fenceq/internal/pgcluster"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

// testOnePhase runs every statement of a job's life, and of the worker's maintenance,
// against a schema of its own and checks that none is committed in two phases: each
// writes the schema's node only, in one routed statement or in a transaction of routed
// statements. It needs two-phase recovery off (the cluster starts so), or a record
// could be cleared before it is counted. The statements documented in docs/citus.md as
// committed in two phases are run too, and their count is logged.
func testOnePhase(t *testing.T, ctx context.Context, c *pgcluster.Citus) {
	const schema = "fq_citus_phases"
	schemaOn(t, ctx, c, schema)
	pool, err := pgxpool.New(ctx, connstr.WithSearchPath(c.URL(), schema))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	onePhase := func(name string, fn func() error) {
		t.Helper()
		before := preparedCount(t, ctx, c)
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := preparedCount(t, ctx, c) - before; n != 0 {
			t.Errorf("%s recorded %d prepared transactions; want a one-phase commit", name, n)
		}
	}
	twoPhase := func(name string, fn func() error) {
		t.Helper()
		before := preparedCount(t, ctx, c)
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%s: %d prepared transactions (documented as two-phase on Citus)", name, preparedCount(t, ctx, c)-before)
	}
	insert := func(q string, n int) {
		t.Helper()
		for range n {
			if _, err := store.Insert(ctx, pool, store.InsertParams{Kind: "k", Queue: q}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var claimed []queue.Lease
	claim := func(q string, n int) []queue.Lease {
		t.Helper()
		jobs, err := store.Claim(ctx, pool, store.ClaimParams{Queue: q, WorkerID: "w", Limit: n, Lease: time.Minute})
		if err != nil || len(jobs) != n {
			t.Fatalf("claim %d from %s: %d jobs, %v", n, q, len(jobs), err)
		}
		ls := make([]queue.Lease, n)
		for i, j := range jobs {
			ls[i] = queue.Lease{JobID: j.ID, Gen: j.LeaseGen, Holder: "w"}
		}
		return ls
	}

	onePhase("RegisterWorker", func() error { return store.RegisterWorker(ctx, pool, "w", "h", 1, []string{"q"}, []string{"k"}) })
	onePhase("Insert", func() error { _, err := store.Insert(ctx, pool, store.InsertParams{Kind: "k", Queue: "q"}); return err })
	onePhase("Insert in a transaction", func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.Insert(ctx, tx, store.InsertParams{Kind: "k", Queue: "q"})
			return err
		})
	})
	insert("q", 8)
	onePhase("Claim", func() error { claimed = claim("q", 10); return nil })
	onePhase("Heartbeat", func() error { _, err := store.Heartbeat(ctx, pool, "w", claimed, time.Minute); return err })
	onePhase("Complete", func() error { return store.Complete(ctx, pool, claimed[0]) })
	onePhase("Complete under the lease that completed it", func() error {
		// The attempt's own completion, found: it counts once, no stale write.
		if err := store.Complete(ctx, pool, claimed[0]); err != nil {
			t.Errorf("second completion under the completing lease: %v; want nil", err)
		}
		return nil
	})
	// A generation before the claim's: a holder whose lease was taken from it.
	stale := claimed[0]
	stale.Gen--
	onePhase("Complete of a lost lease", func() error {
		if err := store.Complete(ctx, pool, stale); !errors.Is(err, queue.ErrLeaseLost) {
			t.Errorf("completion under an older generation: %v; want a lost lease", err)
		}
		return nil
	})
	onePhase("CompleteMany with a lost lease", func() error {
		lost, err := store.CompleteMany(ctx, pool, "w", []queue.Lease{stale, claimed[1], claimed[2]})
		if err == nil && (len(lost) != 1 || lost[0] != stale) {
			t.Errorf("lost %v; want only %v", lost, stale)
		}
		return err
	})
	onePhase("Fail", func() error { _, err := store.Fail(ctx, pool, claimed[3], store.FailParams{Err: "x"}); return err })
	onePhase("Snooze", func() error { return store.Snooze(ctx, pool, claimed[4], time.Second) })
	onePhase("Cancel", func() error { return store.Cancel(ctx, pool, claimed[5], "r") })
	onePhase("Release", func() error { return store.Release(ctx, pool, claimed[6]) })
	onePhase("WithLease with an outbox row", func() error {
		l := claimed[7]
		return store.WithLease(ctx, pool, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.Insert(ctx, tx, outbox.Message{Topic: "t", DedupeKey: "one-phase", Payload: []byte(`{}`), JobID: l.JobID})
			return err
		})
	})
	if _, err := pool.Exec(ctx, `CREATE TABLE results (job_id bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	insert("writes", 1)
	onePhase("WithLeaseWrites (one pipeline)", func() error {
		l := claim("writes", 1)[0]
		w := &store.Writes{}
		w.Exec(`INSERT INTO results (job_id) VALUES ($1)`, l.JobID)
		return store.WithLeaseWrites(ctx, pool, l, store.LeaseTx{Complete: true}, w)
	})
	onePhase("Reap of nothing", func() error { _, err := store.Reap(ctx, pool, store.ReapParams{HolderFresh: time.Minute}); return err })
	if _, err := pool.Exec(ctx, `UPDATE fenceq_jobs_hot SET lease_expires_at = now() - interval '1 second' WHERE id = ANY($1)`,
		[]int64{claimed[8].JobID, claimed[9].JobID}); err != nil {
		t.Fatal(err)
	}
	onePhase("Reap of two expired leases", func() error {
		revs, err := store.Reap(ctx, pool, store.ReapParams{HolderFresh: time.Minute})
		if err == nil && (len(revs) != 2 || !revs[0].HolderAlive) {
			t.Errorf("revocations %+v; want two, their holder alive", revs)
		}
		return err
	})
	onePhase("RecordLeasesLost", func() error {
		alive, err := store.RecordLeasesLost(ctx, pool, "w", claimed[8:10])
		if err == nil && len(alive) != 0 {
			// The reaper saw the holder alive and recorded it already.
			t.Errorf("expired_holder_alive recorded again for %v", alive)
		}
		return err
	})
	onePhase("RecordLeaseEvents", func() error {
		return store.RecordLeaseEvents(ctx, pool, queue.EventHeartbeatLost, "w", "d", claimed[8:10])
	})
	onePhase("PromoteDue", func() error { _, err := store.PromoteDue(ctx, pool, 100); return err })
	onePhase("idempotency Claim and Finish", func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			r, err := idempotency.Claim(ctx, tx, idempotency.ClaimParams{Scope: "s", Key: "k", RequestHash: []byte("h")})
			if err != nil {
				return err
			}
			_, err = idempotency.Finish(ctx, tx, r.Record, idempotency.Response{Status: 200})
			return err
		})
	})
	onePhase("RetryJob", func() error { _, err := store.RetryJob(ctx, pool, claimed[5].JobID); return err })
	// The events the Citus forms wrote are those the single statements write on
	// PostgreSQL.
	rows, err := pool.Query(ctx, `SELECT kind || '|' || coalesce(detail, '') || '|' || coalesce(worker_id, '') FROM fenceq_lease_events`)
	if err != nil {
		t.Fatal(err)
	}
	events, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, e := range events {
		got[e]++
	}
	want := map[string]int{
		"stale_write_rejected|complete|w":                                  2,
		"revoked|lease expired; now available|w":                           2,
		"expired_holder_alive|holder still heartbeats in fenceq_workers|w": 2,
		"heartbeat_lost|heartbeat found the lease gone|w":                  2,
		"heartbeat_lost|d|w":                                               2,
	}
	if !maps.Equal(got, want) {
		t.Errorf("lease events %v; want %v", got, want)
	}

	onePhase("PruneFinished", func() error { _, err := store.PruneFinished(ctx, pool, 0, 100); return err })
	onePhase("PruneLeaseEvents", func() error { _, err := store.PruneLeaseEvents(ctx, pool, 0, 100); return err })
	onePhase("idempotency DeleteExpired", func() error { _, err := idempotency.DeleteExpired(ctx, pool, 100); return err })
	onePhase("outbox FailOrphaned", func() error { _, err := outbox.FailOrphaned(ctx, pool, 100); return err })
	onePhase("DeleteStaleWorkers", func() error { _, err := store.DeleteStaleWorkers(ctx, pool, time.Hour); return err })
	insert("many-a", 2)
	insert("many-b", 3)
	onePhase("ClaimMany", func() error {
		jobs, err := store.ClaimMany(ctx, pool, store.ClaimManyParams{WorkerID: "w", Lease: time.Minute, Kinds: []string{"k"},
			Queues: []store.QueueClaim{{Name: "many-a", Limit: 5}, {Name: "many-b", Limit: 2}}})
		if err == nil && len(jobs) != 4 {
			err = fmt.Errorf("claimed %d jobs, want 2 of many-a and 2 of many-b", len(jobs))
		}
		return err
	})
	onePhase("OtherKindsAhead", func() error {
		_, err := store.OtherKindsAhead(ctx, pool, []string{"k"}, []store.QueueBefore{{Name: "many-a"}, {Name: "many-b"}})
		return err
	})

	twoPhase("InsertMany (COPY)", func() error {
		_, err := store.InsertMany(ctx, pool, []store.InsertParams{{Kind: "k", Queue: "m"}, {Kind: "k", Queue: "m"}})
		return err
	})
	twoPhase("CancelJob of a running job", func() error {
		insert("c", 1)
		_, err := store.CancelJob(ctx, pool, claim("c", 1)[0].JobID, "x")
		return err
	})
}
