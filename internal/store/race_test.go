package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// Several pools claim from 10,000 jobs at once. Every
// (id, lease_gen) is claimed once, every job completes exactly once, no completion is
// rejected.
func TestClaimRaceEveryJobOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const total = 10000
	ps := make([]store.InsertParams, total)
	for i := range ps {
		ps[i] = store.InsertParams{Kind: "race", Args: []byte(fmt.Sprintf(`{"i":%d}`, i))}
	}
	n, err := store.InsertMany(b.ctx, b.db.Pool, ps)
	if err != nil || n != total {
		t.Fatalf("insert: %d %v", n, err)
	}

	type claim struct{ id, gen int64 }
	var mu sync.Mutex
	seen := map[int64]int{}
	var claims []claim
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	const pools, perPool = 4, 3
	for p := 0; p < pools; p++ {
		pool := b.db.NewPool(t, perPool)
		for g := 0; g < perPool; g++ {
			wg.Add(1)
			worker := fmt.Sprintf("w%d-%d", p, g)
			go func() {
				defer wg.Done()
				for {
					jobs, err := store.Claim(b.ctx, pool, store.ClaimParams{Queue: "default", WorkerID: worker, Limit: 50, Lease: time.Minute})
					if err != nil {
						errs <- err
						return
					}
					if len(jobs) == 0 {
						return
					}
					leases := make([]queue.Lease, len(jobs))
					mu.Lock()
					for i, j := range jobs {
						leases[i] = store.LeaseOf(j)
						seen[j.ID]++
						claims = append(claims, claim{j.ID, j.LeaseGen})
					}
					mu.Unlock()
					lost, err := store.CompleteMany(b.ctx, pool, worker, leases)
					if err != nil {
						errs <- err
						return
					}
					if len(lost) > 0 {
						errs <- fmt.Errorf("%d completions rejected: %+v", len(lost), lost[0])
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != total || len(claims) != total {
		t.Fatalf("claimed %d distinct jobs in %d claims, want %d and %d", len(seen), len(claims), total, total)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("job %d claimed %d times", id, c)
		}
	}
	for _, c := range claims {
		if c.gen != 1 {
			t.Fatalf("job %d claimed at generation %d, want 1", c.id, c.gen)
		}
	}
	var completed, finished int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE state = 'completed'), count(finished_at) FROM fenceq_jobs`).Scan(&completed, &finished); err != nil {
		t.Fatal(err)
	}
	if completed != total || finished != total {
		t.Fatalf("completed %d finished %d, want %d", completed, finished, total)
	}
}

// Test 6: the reaper and a fenced commit race over thousands of iterations with a tiny
// lease. Exactly one wins each time: either the commit landed (result row, job
// completed, lease not revoked) or the reaper revoked the lease (commit rejected with
// ErrLeaseLost, no result row). Never both, never neither.
func TestReaperVersusCommitRaceExactlyOneWins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A fixed number of iterations, however long they take: a busy machine (or Citus)
	// needs more than the bundle's two minutes for them, so the test's context ends
	// with the test, and go test's -timeout bounds it.
	b.ctx = t.Context()
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE results (job_id bigint PRIMARY KEY, lease_gen bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	reaperPool := b.db.NewPool(t, 2)
	const iterations = 2000
	var commitWins, reaperWins int
	for i := 0; i < iterations; i++ {
		j := b.insert(t, store.InsertParams{Kind: "race", MaxAttempts: 1000})
		claimed := b.claim(t, "holder", 1, time.Millisecond) // expires almost at once
		if len(claimed) != 1 || claimed[0].ID != j.ID {
			t.Fatalf("iteration %d: claim %+v", i, claimed)
		}
		l := store.LeaseOf(claimed[0])
		var wg sync.WaitGroup
		var commitErr error
		var revs []queue.Revocation
		var reapErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			commitErr = store.WithLease(b.ctx, b.db.Pool, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO results (job_id, lease_gen) VALUES ($1, $2)`, l.JobID, l.Gen)
				return err
			})
		}()
		go func() {
			defer wg.Done()
			revs, reapErr = store.Reap(b.ctx, reaperPool, store.ReapParams{HolderFresh: time.Second})
		}()
		wg.Wait()
		if reapErr != nil {
			t.Fatal(reapErr)
		}
		revoked := len(revs) == 1 && revs[0].JobID == l.JobID && revs[0].Gen == l.Gen
		if commitErr != nil && !errors.Is(commitErr, queue.ErrLeaseLost) {
			t.Fatalf("iteration %d: commit: %v", i, commitErr)
		}
		committed := commitErr == nil
		if committed == revoked {
			t.Fatalf("iteration %d: committed=%v revoked=%v: exactly one must win", i, committed, revoked)
		}
		var rows int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM results WHERE job_id = $1`, l.JobID).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		final := b.job(t, l.JobID)
		if committed {
			commitWins++
			if rows != 1 || final.State != queue.StateCompleted || final.LeaseGen != l.Gen {
				t.Fatalf("iteration %d: commit won but rows=%d state=%s gen=%d", i, rows, final.State, final.LeaseGen)
			}
		} else {
			reaperWins++
			if rows != 0 || final.State != queue.StateAvailable || final.LeaseGen != l.Gen+1 {
				t.Fatalf("iteration %d: reaper won but rows=%d state=%s gen=%d", i, rows, final.State, final.LeaseGen)
			}
			// Take the job out of the way so the next iteration claims the new one.
			if _, err := b.db.Pool.Exec(b.ctx, `DELETE FROM fenceq_jobs WHERE id = $1`, l.JobID); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("commit won %d times, reaper won %d times", commitWins, reaperWins)
	if reaperWins == 0 {
		t.Fatal("the reaper never won: the race was not exercised")
	}
	if n := b.events(t, queue.EventStaleWriteRejected); n != int64(reaperWins) {
		t.Fatalf("stale_write_rejected events = %d, want one per lost commit (%d)", n, reaperWins)
	}
}

// Test 2: a pause between the fence check and the writes cannot be exploited. From its
// first statement on (which carries the check), the fenced commit holds the job row
// lock; the reaper, even with the lease expired by the
// database clock, cannot revoke it until COMMIT — and then there is nothing to revoke.
// In the other order the reaper revokes first and the commit is rejected whole.
func TestFencedCommitHoldsOffReaper(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE results (job_id bigint PRIMARY KEY, lease_gen bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	waitExpired := func(t *testing.T, id int64) {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			var expired bool
			if err := b.db.Pool.QueryRow(b.ctx, `SELECT lease_expires_at < now() FROM fenceq_jobs WHERE id = $1`, id).Scan(&expired); err != nil {
				t.Fatal(err)
			}
			if expired {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("lease of job %d never expired by the database's clock", id)
	}

	t.Run("CommitWins", func(t *testing.T) {
		j := b.insert(t, store.InsertParams{Kind: "fence"})
		l := store.LeaseOf(b.claim(t, "holder", 1, 200*time.Millisecond)[0])
		err := store.WithLease(b.ctx, b.db.Pool, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
			// The first statement takes the lock (it travels with BEGIN and the lock).
			if _, err := tx.Exec(ctx, `INSERT INTO results VALUES ($1, $2)`, l.JobID, l.Gen); err != nil {
				return err
			}
			// Inside the fence: the holder "pauses" until its lease has expired by the
			// database's clock, then the reaper runs.
			waitExpired(t, j.ID)
			revs, err := store.Reap(ctx, b.db.Pool, store.ReapParams{})
			if err != nil {
				return err
			}
			if len(revs) != 0 {
				return fmt.Errorf("reaper revoked %+v while the fenced commit held the row", revs)
			}
			_, err = tx.Exec(ctx, `UPDATE results SET lease_gen = $2 WHERE job_id = $1`, l.JobID, l.Gen)
			return err
		})
		if err != nil {
			t.Fatalf("fenced commit: %v", err)
		}
		if revs, err := store.Reap(b.ctx, b.db.Pool, store.ReapParams{}); err != nil || len(revs) != 0 {
			t.Fatalf("reap after commit: %+v %v; nothing may be left to revoke", revs, err)
		}
		if got := b.job(t, j.ID); got.State != queue.StateCompleted || got.LeaseGen != l.Gen {
			t.Fatalf("job %s gen %d", got.State, got.LeaseGen)
		}
	})
	t.Run("ReaperWins", func(t *testing.T) {
		j := b.insert(t, store.InsertParams{Kind: "fence"})
		l := store.LeaseOf(b.claim(t, "holder", 1, 50*time.Millisecond)[0])
		waitExpired(t, j.ID)
		revs, err := store.Reap(b.ctx, b.db.Pool, store.ReapParams{})
		if err != nil || len(revs) != 1 {
			t.Fatalf("reap: %+v %v", revs, err)
		}
		var insertErr error
		err = store.WithLease(b.ctx, b.db.Pool, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
			_, insertErr = tx.Exec(ctx, `INSERT INTO results VALUES ($1, $2)`, l.JobID, l.Gen)
			return insertErr
		})
		if !errors.Is(err, queue.ErrLeaseLost) || !errors.Is(insertErr, queue.ErrLeaseLost) {
			t.Fatalf("commit after revocation: err %v, the body's statement %v; want ErrLeaseLost for both", err, insertErr)
		}
		var rows int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM results WHERE job_id = $1`, j.ID).Scan(&rows); err != nil || rows != 0 {
			t.Fatalf("rows %d %v", rows, err)
		}
	})
}
