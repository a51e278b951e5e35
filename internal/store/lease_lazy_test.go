package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// pipelinedDBs are the kinds of db on which the fenced transaction begins with its
// function's first statement.
func pipelinedDBs(t *testing.T, b *testBundle) map[string]queue.Beginner {
	t.Helper()
	all := leaseDBs(t, b)
	return map[string]queue.Beginner{"pool": all["pool"], "conn": all["conn"]}
}

// requeue revokes a lease as an operator does: the job is available again at the next
// generation.
func (b *testBundle) requeue(t *testing.T, l queue.Lease) {
	t.Helper()
	if _, err := store.RequeueJob(b.ctx, b.db.Pool, l.JobID); err != nil {
		t.Fatalf("requeue job %d: %v", l.JobID, err)
	}
}

// drop deletes a job, so that the next claims do not take it.
func (b *testBundle) drop(t *testing.T, id int64) {
	t.Helper()
	if _, err := b.db.Pool.Exec(b.ctx, `DELETE FROM fenceq_jobs WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
}

// completedInHistory reports whether the job was moved to the history as completed.
func (b *testBundle) completedInHistory(t *testing.T, id int64) bool {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs_history WHERE id = $1 AND state = 'completed'`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// A lease revoked before the function's first statement: the statement, whatever call
// sends it, returns an error matching ErrLeaseLost and writes nothing, and WithLease
// records the stale write and fails with ErrLeaseLost, whether the function returns the
// error or ignores it.
func TestWithLeaseLostBeforeFirstStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	const insert = `INSERT INTO results (job_id, lease_gen) VALUES ($1, $2) RETURNING job_id`
	firsts := map[string]func(ctx context.Context, tx pgx.Tx, l queue.Lease) error{
		"exec": func(ctx context.Context, tx pgx.Tx, l queue.Lease) error {
			_, err := tx.Exec(ctx, insert, l.JobID, l.Gen)
			return err
		},
		"queryrow": func(ctx context.Context, tx pgx.Tx, l queue.Lease) error {
			var id int64
			return tx.QueryRow(ctx, insert, l.JobID, l.Gen).Scan(&id)
		},
		"query": func(ctx context.Context, tx pgx.Tx, l queue.Lease) error {
			rows, err := tx.Query(ctx, insert, l.JobID, l.Gen)
			if err != nil {
				return err
			}
			_, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			return err
		},
	}
	for dbName, db := range pipelinedDBs(t, b) {
		for firstName, first := range firsts {
			for _, ignore := range []bool{false, true} {
				name := dbName + "/" + firstName
				if ignore {
					name += "/ignored"
				}
				t.Run(name, func(t *testing.T) {
					l := store.LeaseOf(b.claimOne(t))
					b.requeue(t, l)
					before := b.events(t, queue.EventStaleWriteRejected)
					var firstErr, secondErr error
					err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
						firstErr = first(ctx, tx, l)
						if ignore {
							_, secondErr = tx.Exec(ctx, `INSERT INTO results (job_id, lease_gen) VALUES ($1, 0)`, -l.JobID)
							return nil
						}
						return firstErr
					})
					if !errors.Is(firstErr, queue.ErrLeaseLost) {
						t.Fatalf("first statement after revocation: %v, want ErrLeaseLost", firstErr)
					}
					if ignore && !errors.Is(secondErr, queue.ErrLeaseLost) {
						t.Fatalf("second statement after revocation: %v, want ErrLeaseLost", secondErr)
					}
					if !errors.Is(err, queue.ErrLeaseLost) {
						t.Fatalf("WithLease after revocation: %v, want ErrLeaseLost", err)
					}
					if n := b.results(t, l.JobID) + b.results(t, -l.JobID); n != 0 {
						t.Fatalf("%d rows of the function written after revocation, want none", n)
					}
					if n := b.events(t, queue.EventStaleWriteRejected); n != before+1 {
						t.Fatalf("stale_write_rejected events %d → %d, want one more", before, n)
					}
					if got := b.job(t, l.JobID); got.State != queue.StateAvailable || got.LeaseGen != l.Gen+1 {
						t.Fatalf("revoked job: state %s gen %d, want available at gen %d", got.State, got.LeaseGen, l.Gen+1)
					}
					b.drop(t, l.JobID)
					// Nothing was left open on the connection.
					l = store.LeaseOf(b.claimOne(t))
					if err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
						return first(ctx, tx, l)
					}); err != nil || b.results(t, l.JobID) != 1 || !b.completedInHistory(t, l.JobID) {
						t.Fatalf("commit on the same db afterwards: %v, results %d", err, b.results(t, l.JobID))
					}
				})
			}
		}
	}
}

// A function that sends nothing completes a held lease, or keeps it without Complete,
// and is rejected with ErrLeaseLost, recorded, when the lease is gone.
func TestWithLeaseFunctionSendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fns := map[string]store.TxFunc{
		"nil":   nil,
		"empty": func(context.Context, pgx.Tx) error { return nil },
	}
	for dbName, db := range pipelinedDBs(t, b) {
		for fnName, fn := range fns {
			t.Run(dbName+"/"+fnName, func(t *testing.T) {
				l := store.LeaseOf(b.claimOne(t))
				if err := store.WithLease(b.ctx, db, l, store.LeaseTx{}, fn); err != nil {
					t.Fatalf("with lease, lease held: %v", err)
				}
				if got := b.job(t, l.JobID); got.State != queue.StateRunning || got.LeaseGen != l.Gen {
					t.Fatalf("after WithLease without Complete: state %s gen %d, want running at gen %d", got.State, got.LeaseGen, l.Gen)
				}
				if err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, fn); err != nil {
					t.Fatalf("commit, lease held: %v", err)
				}
				if !b.completedInHistory(t, l.JobID) {
					t.Fatalf("job %d is not completed in the history after the commit", l.JobID)
				}

				for _, how := range []store.LeaseTx{{}, {Complete: true}} {
					l := store.LeaseOf(b.claimOne(t))
					b.requeue(t, l)
					before := b.events(t, queue.EventStaleWriteRejected)
					if err := store.WithLease(b.ctx, db, l, how, fn); !errors.Is(err, queue.ErrLeaseLost) {
						t.Fatalf("%+v after revocation: %v, want ErrLeaseLost", how, err)
					}
					if n := b.events(t, queue.EventStaleWriteRejected); n != before+1 {
						t.Fatalf("%+v: stale_write_rejected events %d → %d, want one more", how, before, n)
					}
					if got := b.job(t, l.JobID); got.State != queue.StateAvailable || got.LeaseGen != l.Gen+1 {
						t.Fatalf("%+v: revoked job: state %s gen %d", how, got.State, got.LeaseGen)
					}
					b.drop(t, l.JobID)
				}
			})
		}
	}
}

// A function whose first statement is an Exec or a QueryRow commits its rows with the
// completion; a QueryRow whose row is never scanned still runs, and a failing first
// statement writes nothing and leaves the job running under its lease.
func TestWithLeaseFirstStatementCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	for dbName, db := range pipelinedDBs(t, b) {
		t.Run(dbName, func(t *testing.T) {
			l := store.LeaseOf(b.claimOne(t))
			if err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				return insertResult(ctx, tx, l)
			}); err != nil {
				t.Fatalf("commit with an Exec first: %v", err)
			}
			if b.results(t, l.JobID) != 1 || !b.completedInHistory(t, l.JobID) {
				t.Fatalf("after the commit: results %d, completed in history %v", b.results(t, l.JobID), b.completedInHistory(t, l.JobID))
			}

			l = store.LeaseOf(b.claimOne(t))
			var gen int64
			if err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				if err := tx.QueryRow(ctx, `INSERT INTO results (job_id, lease_gen) VALUES ($1, $2) RETURNING lease_gen`, l.JobID, l.Gen).Scan(&gen); err != nil {
					return err
				}
				return tx.QueryRow(ctx, `SELECT lease_gen FROM results WHERE job_id = $1`, l.JobID).Scan(&gen)
			}); err != nil || gen != l.Gen {
				t.Fatalf("commit with a QueryRow first: %v, scanned %d, want %d", err, gen, l.Gen)
			}
			if b.results(t, l.JobID) != 1 || !b.completedInHistory(t, l.JobID) {
				t.Fatalf("after the commit: results %d", b.results(t, l.JobID))
			}

			// A row never scanned: its statement ran all the same, and the next
			// statement sees it.
			l = store.LeaseOf(b.claimOne(t))
			var seen int
			if err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				_ = tx.QueryRow(ctx, `INSERT INTO results (job_id, lease_gen) VALUES ($1, $2) RETURNING job_id`, l.JobID, l.Gen)
				return tx.QueryRow(ctx, `SELECT count(*) FROM results WHERE job_id = $1`, l.JobID).Scan(&seen)
			}); err != nil || seen != 1 {
				t.Fatalf("commit with an unscanned row: %v, the next statement saw %d rows, want 1", err, seen)
			}
			if b.results(t, l.JobID) != 1 || !b.completedInHistory(t, l.JobID) {
				t.Fatalf("after the commit: results %d", b.results(t, l.JobID))
			}
			l = store.LeaseOf(b.claimOne(t))
			if err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				_ = tx.QueryRow(ctx, `INSERT INTO results (job_id, lease_gen) VALUES ($1, $2) RETURNING job_id`, l.JobID, l.Gen)
				return nil
			}); err != nil || b.results(t, l.JobID) != 1 || !b.completedInHistory(t, l.JobID) {
				t.Fatalf("commit whose last row was never scanned: %v, results %d", err, b.results(t, l.JobID))
			}

			// The first statement fails (a duplicate key): nothing is written, the
			// error is the statement's, the job stays running.
			l = store.LeaseOf(b.claimOne(t))
			dup := l
			dup.JobID = l.JobID - 1 // the previous job's row exists
			err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				return insertResult(ctx, tx, dup)
			})
			if err == nil || errors.Is(err, queue.ErrLeaseLost) {
				t.Fatalf("commit whose first statement failed: %v, want the statement's error", err)
			}
			if got := b.job(t, l.JobID); got.State != queue.StateRunning || got.LeaseGen != l.Gen || b.results(t, l.JobID) != 0 {
				t.Fatalf("after the failed statement: state %s gen %d results %d", got.State, got.LeaseGen, b.results(t, l.JobID))
			}
		})
	}
}

// Calls that cannot travel behind BEGIN and the lock (a batch, a savepoint, an Exec
// without arguments, an Exec with an exec mode) begin the transaction first and run
// under the lock.
func TestWithLeaseOtherFirstCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	firsts := map[string]func(ctx context.Context, tx pgx.Tx, l queue.Lease) error{
		"sendbatch": func(ctx context.Context, tx pgx.Tx, l queue.Lease) error {
			bt := &pgx.Batch{}
			bt.Queue(`INSERT INTO results (job_id, lease_gen) VALUES ($1, $2)`, l.JobID, l.Gen)
			return tx.SendBatch(ctx, bt).Close()
		},
		"savepoint": func(ctx context.Context, tx pgx.Tx, l queue.Lease) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := insertResult(ctx, sp, l); err != nil {
				return err
			}
			return sp.Commit(ctx)
		},
		"exec without arguments": func(ctx context.Context, tx pgx.Tx, l queue.Lease) error {
			if _, err := tx.Exec(ctx, `SET LOCAL application_name = 'fenced'`); err != nil {
				return err
			}
			return insertResult(ctx, tx, l)
		},
		"exec mode": func(ctx context.Context, tx pgx.Tx, l queue.Lease) error {
			_, err := tx.Exec(ctx, `INSERT INTO results (job_id, lease_gen) VALUES ($1, $2)`, pgx.QueryExecModeSimpleProtocol, l.JobID, l.Gen)
			return err
		},
	}
	for dbName, db := range pipelinedDBs(t, b) {
		for firstName, first := range firsts {
			t.Run(dbName+"/"+firstName, func(t *testing.T) {
				l := store.LeaseOf(b.claimOne(t))
				if err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
					return first(ctx, tx, l)
				}); err != nil || b.results(t, l.JobID) != 1 || !b.completedInHistory(t, l.JobID) {
					t.Fatalf("commit: %v, results %d", err, b.results(t, l.JobID))
				}

				l = store.LeaseOf(b.claimOne(t))
				b.requeue(t, l)
				var firstErr error
				err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
					firstErr = first(ctx, tx, l)
					return firstErr
				})
				if !errors.Is(err, queue.ErrLeaseLost) || !errors.Is(firstErr, queue.ErrLeaseLost) || b.results(t, l.JobID) != 0 {
					t.Fatalf("after revocation: WithLease %v, first call %v, results %d; want ErrLeaseLost and nothing written", err, firstErr, b.results(t, l.JobID))
				}
				b.drop(t, l.JobID)
			})
		}
	}
}

// A function that rolls back before sending anything writes nothing and fails
// WithLease with an error other than ErrLeaseLost.
func TestWithLeaseRollbackBeforeAnything(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for dbName, db := range pipelinedDBs(t, b) {
		t.Run(dbName, func(t *testing.T) {
			l := store.LeaseOf(b.claimOne(t))
			err := store.WithLease(b.ctx, db, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
				return tx.Rollback(ctx)
			})
			if err == nil || errors.Is(err, queue.ErrLeaseLost) {
				t.Fatalf("commit whose function rolled back first: %v, want an error other than ErrLeaseLost", err)
			}
			if got := b.job(t, l.JobID); got.State != queue.StateRunning || got.LeaseGen != l.Gen {
				t.Fatalf("after the rollback: state %s gen %d, want running at gen %d", got.State, got.LeaseGen, l.Gen)
			}
		})
	}
}

// The pipelined fenced transaction costs one round trip besides the function's
// statements: BEGIN and the lock travel with the first statement, the completion with
// COMMIT. A function that sends nothing costs one round trip in all; a first call that
// cannot carry BEGIN and the lock (a Query) costs one more.
func TestWithLeaseLazyRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createResults(t, b)
	conn, counter := countedConn(t, b)
	cases := []struct {
		name string
		fn   func(l queue.Lease) store.TxFunc
		want int64
	}{
		{"two execs", func(l queue.Lease) store.TxFunc {
			return func(ctx context.Context, tx pgx.Tx) error {
				if err := insertResult(ctx, tx, l); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE results SET lease_gen = $2 WHERE job_id = $1`, l.JobID, l.Gen)
				return err
			}
		}, 3},
		{"queryrow then exec", func(l queue.Lease) store.TxFunc {
			return func(ctx context.Context, tx pgx.Tx) error {
				var id int64
				if err := tx.QueryRow(ctx, `INSERT INTO results (job_id, lease_gen) VALUES ($1, $2) RETURNING job_id`, l.JobID, l.Gen).Scan(&id); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE results SET lease_gen = $2 WHERE job_id = $1`, id, l.Gen)
				return err
			}
		}, 3},
		{"query then exec", func(l queue.Lease) store.TxFunc {
			return func(ctx context.Context, tx pgx.Tx) error {
				rows, err := tx.Query(ctx, `SELECT count(*) FROM results WHERE job_id = $1`, l.JobID)
				if err != nil {
					return err
				}
				if _, err := pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
					return err
				}
				return insertResult(ctx, tx, l)
			}
		}, 4},
		{"nothing", func(queue.Lease) store.TxFunc { return nil }, 1},
	}
	for _, c := range cases {
		// The first round counts the statements' preparation too; the next ones show
		// the steady cost.
		for i := range 3 {
			l := store.LeaseOf(b.claimOne(t))
			before := counter.n.Load()
			if err := store.WithLease(b.ctx, conn, l, store.LeaseTx{Complete: true}, c.fn(l)); err != nil {
				t.Fatalf("%s, commit %d: %v", c.name, i, err)
			}
			if n := counter.n.Load() - before; n != c.want {
				t.Fatalf("%s, commit %d: %d round trips, want %d", c.name, i, n, c.want)
			}
			if !b.completedInHistory(t, l.JobID) {
				t.Fatalf("%s, commit %d: job not completed", c.name, i)
			}
		}
	}
}
