package store_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// beginnerOnly hides the pool's type, so WithLease takes its one-statement-per-round-
// trip path.
type beginnerOnly struct{ *pgxpool.Pool }

// leaseDBs are the kinds of db WithLease is given: a pool and a connection (pipelined)
// and any other Beginner.
func leaseDBs(t *testing.T, b *testBundle) map[string]queue.Beginner {
	t.Helper()
	conn, err := pgx.Connect(b.ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return map[string]queue.Beginner{"pool": b.db.Pool, "conn": conn, "beginner": beginnerOnly{b.db.Pool}}
}

func createResults(t *testing.T, b *testBundle) {
	t.Helper()
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE results (job_id bigint PRIMARY KEY, lease_gen bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

func (b *testBundle) results(t *testing.T, id int64) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM results WHERE job_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func insertResult(ctx context.Context, tx pgx.Tx, l queue.Lease) error {
	_, err := tx.Exec(ctx, `INSERT INTO results (job_id, lease_gen) VALUES ($1, $2)`, l.JobID, l.Gen)
	return err
}

// Every kind of db commits the rows, the output and the completion together, keeps a
// job running without Complete, and rejects a revoked lease writing nothing.
func TestWithLeaseOnEveryKindOfDB(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	for name, db := range leaseDBs(t, b) {
		t.Run(name, func(t *testing.T) {
			b.insert(t, store.InsertParams{Kind: "fenced"})
			l := store.LeaseOf(b.claim(t, "holder", 1, time.Minute)[0])
			how := store.LeaseTx{Complete: true, Output: func() []byte { return []byte(`{"ok":true}`) }}
			if err := store.WithLease(b.ctx, db, l, how, func(ctx context.Context, tx pgx.Tx) error {
				return insertResult(ctx, tx, l)
			}); err != nil {
				t.Fatalf("commit: %v", err)
			}
			got := b.job(t, l.JobID)
			if got.State != queue.StateCompleted || got.LeaseGen != l.Gen || string(got.Output) != `{"ok": true}` || b.results(t, l.JobID) != 1 {
				t.Fatalf("after commit: state %s gen %d output %s results %d", got.State, got.LeaseGen, got.Output, b.results(t, l.JobID))
			}

			b.insert(t, store.InsertParams{Kind: "fenced"})
			l = store.LeaseOf(b.claim(t, "holder", 1, time.Minute)[0])
			if err := store.WithLease(b.ctx, db, l, store.LeaseTx{}, func(ctx context.Context, tx pgx.Tx) error {
				return insertResult(ctx, tx, l)
			}); err != nil {
				t.Fatalf("with lease: %v", err)
			}
			if got := b.job(t, l.JobID); got.State != queue.StateRunning || b.results(t, l.JobID) != 1 {
				t.Fatalf("after WithLease without Complete: state %s results %d", got.State, b.results(t, l.JobID))
			}

			b.expire(t, l.JobID)
			if revs, err := store.Reap(b.ctx, b.db.Pool, store.ReapParams{}); err != nil || len(revs) != 1 {
				t.Fatalf("reap: %+v %v", revs, err)
			}
			before := b.events(t, queue.EventStaleWriteRejected)
			var insertErr error
			called := false
			err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				called = true
				insertErr = insertResult(ctx, tx, l)
				return insertErr
			})
			// A pipelined transaction checks the lease with the function's first
			// statement, any other before the function runs: either way nothing of it
			// is written.
			if !errors.Is(err, queue.ErrLeaseLost) || (called && !errors.Is(insertErr, queue.ErrLeaseLost)) || b.results(t, l.JobID) != 1 {
				t.Fatalf("commit after revocation: %v, body ran %v, its statement: %v, results %d; want ErrLeaseLost and the one row of before", err, called, insertErr, b.results(t, l.JobID))
			}
			if n := b.events(t, queue.EventStaleWriteRejected); n != before+1 {
				t.Fatalf("stale_write_rejected events %d → %d, want one more", before, n)
			}
			// Take the revoked job out of the way of the next claims.
			if _, err := b.db.Pool.Exec(b.ctx, `DELETE FROM fenceq_jobs WHERE id = $1`, l.JobID); err != nil {
				t.Fatal(err)
			}
			// The connection is usable afterwards: nothing was left open on it.
			if err := store.WithLease(b.ctx, db, store.LeaseOf(b.claimOne(t)), store.LeaseTx{Complete: true}, nil); err != nil {
				t.Fatalf("commit after a rejected one: %v", err)
			}
		})
	}
}

func (b *testBundle) claimOne(t *testing.T) *queue.JobRow {
	t.Helper()
	b.insert(t, store.InsertParams{Kind: "fenced"})
	return b.claim(t, "holder", 1, time.Minute)[0]
}

// A completion that matches no row although the lock held (here the function itself
// moved the job's generation) fails before COMMIT: nothing the function wrote is kept,
// and the error matches ErrLeaseLost.
func TestWithLeaseCompletionMissCommitsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	for name, db := range leaseDBs(t, b) {
		t.Run(name, func(t *testing.T) {
			l := store.LeaseOf(b.claimOne(t))
			err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				if err := insertResult(ctx, tx, l); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE fenceq_jobs SET lease_gen = lease_gen + 1 WHERE id = $1`, l.JobID)
				return err
			})
			if !errors.Is(err, queue.ErrLeaseLost) {
				t.Fatalf("commit whose completion matched no row: %v, want ErrLeaseLost", err)
			}
			if got := b.job(t, l.JobID); got.State != queue.StateRunning || got.LeaseGen != l.Gen || b.results(t, l.JobID) != 0 {
				t.Fatalf("after the missed completion: state %s gen %d results %d; want nothing written", got.State, got.LeaseGen, b.results(t, l.JobID))
			}
			if err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				return insertResult(ctx, tx, l)
			}); err != nil {
				t.Fatalf("commit on the same db afterwards: %v", err)
			}
		})
	}
}

// Inside a fenced transaction, pipelined or not, Commit is refused, Rollback fails the
// transaction as a whole, and the transaction cannot be used once the function
// returned.
func TestWithLeaseTxEndsWithItsFunction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	for _, name := range []string{"pool", "conn", "beginner"} {
		db := leaseDBs(t, b)[name]
		t.Run(name, func(t *testing.T) {
			l := store.LeaseOf(b.claimOne(t))
			var commitErr error
			var kept pgx.Tx
			err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				kept = tx
				if err := insertResult(ctx, tx, l); err != nil {
					return err
				}
				commitErr = tx.Commit(ctx)
				return nil
			})
			if err != nil || commitErr == nil {
				t.Fatalf("commit: %v, Commit inside the function: %v; want the commit and a refused Commit", err, commitErr)
			}
			if got := b.job(t, l.JobID); got.State != queue.StateCompleted || b.results(t, l.JobID) != 1 {
				t.Fatalf("after commit: state %s results %d", got.State, b.results(t, l.JobID))
			}
			if _, err := kept.Exec(b.ctx, `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
				t.Fatalf("Exec on the transaction after its function returned: %v, want ErrTxClosed", err)
			}
			rows, _ := kept.Query(b.ctx, `SELECT 1`)
			if _, err := pgx.CollectRows(rows, pgx.RowTo[int]); !errors.Is(err, pgx.ErrTxClosed) {
				t.Fatalf("Query on the transaction after its function returned: %v, want ErrTxClosed", err)
			}

			l = store.LeaseOf(b.claimOne(t))
			err = store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				if err := insertResult(ctx, tx, l); err != nil {
					return err
				}
				return tx.Rollback(ctx)
			})
			if err == nil || errors.Is(err, queue.ErrLeaseLost) {
				t.Fatalf("commit whose function rolled back: %v, want an error other than ErrLeaseLost", err)
			}
			if got := b.job(t, l.JobID); got.State != queue.StateRunning || got.LeaseGen != l.Gen || b.results(t, l.JobID) != 0 {
				t.Fatalf("after the rollback: state %s gen %d results %d; want nothing written", got.State, got.LeaseGen, b.results(t, l.JobID))
			}
		})
	}
}

// sendCounter counts what a connection sends: each query and each batch is one round
// trip (statement preparation is traced apart and not counted).
type sendCounter struct{ n atomic.Int64 }

func (c *sendCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *sendCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *sendCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *sendCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *sendCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// countedConn is a connection to the test's schema whose round trips counter counts,
// from its first fenced commit on.
func countedConn(t *testing.T, b *testBundle) (*pgx.Conn, *sendCounter) {
	t.Helper()
	cfg, err := pgx.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	counter := &sendCounter{}
	cfg.Tracer = counter
	conn, err := pgx.ConnectConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	// The connection's first completion reads whether fenceq_jobs is distributed, once;
	// read it here so that the counts are those of every commit.
	if _, err := store.SelfNotify(b.ctx, conn); err != nil {
		t.Fatal(err)
	}
	counter.n.Store(0)
	return conn, counter
}

// A pipelined fenced commit of one statement costs two round trips: BEGIN and the lock
// with the statement, the completion with COMMIT.
func TestWithLeasePipelinedRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	conn, counter := countedConn(t, b)
	for i := range 3 {
		l := store.LeaseOf(b.claimOne(t))
		before := counter.n.Load()
		if err := store.WithLease(b.ctx, conn, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
			return insertResult(ctx, tx, l)
		}); err != nil {
			t.Fatal(err)
		}
		if n := counter.n.Load() - before; n != 2 {
			t.Fatalf("commit %d: %d round trips for one statement of the function, want 2", i, n)
		}
	}
}

// The fenced transaction's lock and completion find the job by its primary key, with
// many jobs running and statistics taken when none ran (a fresh, analyzed table, as in
// every benchmark run): compared to the constant 'running', the partial index over
// running jobs looks like one row to the planner and would be walked whole instead.
func TestFencedStatementsFindTheRowByID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ps := make([]store.InsertParams, 500)
	for i := range ps {
		ps[i] = store.InsertParams{Kind: "plan"}
	}
	if _, err := store.InsertMany(b.ctx, b.db.Pool, ps); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `VACUUM ANALYZE fenceq_jobs_hot`); err != nil {
		t.Fatal(err)
	}
	l := store.LeaseOf(b.claim(t, "holder", 400, time.Minute)[0])
	conn, err := pgx.Connect(b.ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	stmts := map[string]string{
		"lock(bigint, bigint)":            store.SQLLockLease,
		"lockchecked(bigint, bigint)":     store.SQLLockLeaseChecked,
		"complete(bigint, bigint, jsonb)": store.SQLCompleteLockedChecked,
	}
	for sig, sql := range stmts {
		if _, err := conn.Exec(b.ctx, "PREPARE "+sig+" AS "+sql); err != nil {
			t.Fatalf("prepare %s: %v", sig, err)
		}
	}
	for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
		if _, err := conn.Exec(b.ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for _, exec := range []string{"lock($1, $2)", "lockchecked($1, $2)", "complete($1, $2, NULL)"} {
			rows, err := conn.Query(b.ctx, "EXPLAIN EXECUTE "+exec, pgx.QueryExecModeSimpleProtocol, l.JobID, l.Gen)
			if err != nil {
				t.Fatal(err)
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatalf("explain %s: %v", exec, err)
			}
			plan := strings.Join(lines, "\n")
			if !strings.Contains(plan, "fenceq_jobs_pkey") {
				t.Errorf("%s, %s: the plan does not find the job by its primary key:\n%s", mode, exec, plan)
			}
		}
	}
}

// With MovesOut every kind of db completes a job that keeps no unique key as without
// it: the job moves to history with its output and the function's rows; WithLease's
// pipeline and the writes declared up front alike. A job whose unique states hold
// StateCompleted keeps its key when completed: MovesOutOnCompletion says so, and told
// otherwise the commit fails as for a lost lease, writes nothing and leaves it running.
func TestWithLeaseMovesOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	how := store.LeaseTx{Complete: true, MovesOut: true, Output: func() []byte { return []byte(`{"ok":true}`) }}
	moved := func(t *testing.T, id int64) {
		t.Helper()
		var state, output string
		var inHistory bool
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT state, output::text, EXISTS (SELECT 1 FROM fenceq_jobs_history h WHERE h.id = j.id)
		    FROM fenceq_jobs j WHERE id = $1`, id).Scan(&state, &output, &inHistory); err != nil {
			t.Fatal(err)
		}
		if state != "completed" || output != `{"ok": true}` || !inHistory || b.results(t, id) != 1 {
			t.Fatalf("job %d: %s output %s in history %v, results %d", id, state, output, inHistory, b.results(t, id))
		}
	}
	for name, db := range leaseDBs(t, b) {
		t.Run(name, func(t *testing.T) {
			j := b.claimOne(t)
			if !store.MovesOutOnCompletion(j) {
				t.Fatalf("job %d without a unique key does not move out", j.ID)
			}
			l := store.LeaseOf(j)
			if err := store.WithLease(b.ctx, db, l, how, func(ctx context.Context, tx pgx.Tx) error { return insertResult(ctx, tx, l) }); err != nil {
				t.Fatal(err)
			}
			moved(t, l.JobID)
		})
	}
	l := store.LeaseOf(b.claimOne(t))
	var w store.Writes
	w.Exec(`INSERT INTO results (job_id, lease_gen) VALUES ($1, $2)`, l.JobID, l.Gen)
	if err := store.WithLeaseWrites(b.ctx, b.db.Pool, l, how, &w); err != nil {
		t.Fatalf("commit writes: %v", err)
	}
	moved(t, l.JobID)

	// Keyed while unfinished only: it moves out too.
	b.insert(t, store.InsertParams{Kind: "keyed", Unique: queue.UniqueOpts{ByArgs: true}})
	keyed := b.claim(t, "holder", 1, time.Minute)[0]
	if keyed.UniqueKey == nil || !store.MovesOutOnCompletion(keyed) {
		t.Fatalf("job %d keyed while unfinished: key %v, moves out %v", keyed.ID, keyed.UniqueKey, store.MovesOutOnCompletion(keyed))
	}
	kl := store.LeaseOf(keyed)
	if err := store.WithLease(b.ctx, b.db.Pool, kl, how, func(ctx context.Context, tx pgx.Tx) error { return insertResult(ctx, tx, kl) }); err != nil {
		t.Fatal(err)
	}
	moved(t, kl.JobID)

	// Keyed once completed too: it stays, and told otherwise nothing is written.
	b.insert(t, store.InsertParams{Kind: "kept", Unique: queue.UniqueOpts{ByArgs: true,
		ByState: append(queue.UnfinishedStates(), queue.StateCompleted)}})
	kept := b.claim(t, "holder", 1, time.Minute)[0]
	if store.MovesOutOnCompletion(kept) {
		t.Fatalf("job %d keeps its key once completed (%v), yet moves out", kept.ID, kept.UniqueStates)
	}
	pl := store.LeaseOf(kept)
	err := store.WithLease(b.ctx, b.db.Pool, pl, how, func(ctx context.Context, tx pgx.Tx) error { return insertResult(ctx, tx, pl) })
	if !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("a job keeping its key completed as moving out: %v", err)
	}
	if j := b.job(t, pl.JobID); j.State != queue.StateRunning || b.results(t, pl.JobID) != 0 {
		t.Fatalf("job %d keeping its key: %s, results %d", pl.JobID, j.State, b.results(t, pl.JobID))
	}
}

// CompleteManyMoving completes a batch of jobs that keep no key once completed, moving
// each to history with its output; a job that keeps its key comes back lost and stays
// running, and CompleteManyWithOutputs then completes it in place.
func TestCompleteManyMoving(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{Kind: "plain"})
	b.insert(t, store.InsertParams{Kind: "keyed", Unique: queue.UniqueOpts{ByArgs: true}})
	b.insert(t, store.InsertParams{Kind: "kept", Unique: queue.UniqueOpts{ByArgs: true,
		ByState: append(queue.UnfinishedStates(), queue.StateCompleted)}})
	var moving []queue.Lease
	var kept queue.Lease
	for _, j := range b.claim(t, "holder", 3, time.Minute) {
		if j.Kind == "kept" {
			kept = store.LeaseOf(j)
			if store.MovesOutOnCompletion(j) {
				t.Fatalf("job %d keeps its key once completed (%v), yet moves out", j.ID, j.UniqueStates)
			}
			continue
		}
		if !store.MovesOutOnCompletion(j) {
			t.Fatalf("job %d (%s) does not move out", j.ID, j.Kind)
		}
		moving = append(moving, store.LeaseOf(j))
	}
	if len(moving) != 2 || kept.JobID == 0 {
		t.Fatalf("claimed %v moving and %v kept", moving, kept)
	}
	lost, err := store.CompleteManyMoving(b.ctx, b.db.Pool, "holder", moving, [][]byte{[]byte(`{"n":1}`), nil})
	if err != nil || len(lost) != 0 {
		t.Fatalf("complete moving: lost %v, %v", lost, err)
	}
	for i, l := range moving {
		var state string
		var output *string
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT state, output::text FROM fenceq_jobs_history WHERE id = $1`, l.JobID).Scan(&state, &output); err != nil {
			t.Fatalf("job %d not in history: %v", l.JobID, err)
		}
		if state != "completed" || (i == 0) != (output != nil && *output == `{"n": 1}`) {
			t.Fatalf("job %d: %s, output %v", l.JobID, state, output)
		}
	}
	lost, err = store.CompleteManyMoving(b.ctx, b.db.Pool, "holder", []queue.Lease{kept}, nil)
	if err != nil || len(lost) != 1 || lost[0] != kept {
		t.Fatalf("a job keeping its key completed as moving out: lost %v, %v", lost, err)
	}
	if j := b.job(t, kept.JobID); j.State != queue.StateRunning {
		t.Fatalf("job %d keeping its key: %s after the moving completion", kept.JobID, j.State)
	}
	if lost, err := store.CompleteManyWithOutputs(b.ctx, b.db.Pool, "holder", []queue.Lease{kept}, nil); err != nil || len(lost) != 0 {
		t.Fatalf("complete the kept job: lost %v, %v", lost, err)
	}
	var inHot bool
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM fenceq_jobs_hot WHERE id = $1 AND state = 'completed')`, kept.JobID).Scan(&inHot); err != nil || !inHot {
		t.Fatalf("kept job %d not completed in place: %v, %v", kept.JobID, inHot, err)
	}
}
