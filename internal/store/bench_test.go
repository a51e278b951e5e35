package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// Benchmarks of the engine's hot paths, each in its own schema. Run with
//
//	go test -run '^$' -bench . -benchtime 2s ./queue/
//
// They measure one statement's round trip on the test server, so compare them on the
// same machine only; `fenceq bench` measures whole workloads.

func benchDB(b *testing.B) (*fenceqtest.DB, context.Context) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	b.Cleanup(cancel)
	return fenceqtest.New(b, &fenceqtest.Options{MaxConns: 4}), ctx
}

func fill(b *testing.B, db *fenceqtest.DB, ctx context.Context, n int) {
	b.Helper()
	ps := make([]store.InsertParams, n)
	for i := range ps {
		ps[i] = store.InsertParams{Kind: "bench", Args: []byte(fmt.Sprintf(`{"n":%d}`, i))}
	}
	for len(ps) > 0 {
		k := min(len(ps), 5000)
		if _, err := store.InsertMany(ctx, db.Pool, ps[:k]); err != nil {
			b.Fatalf("fill: %v", err)
		}
		ps = ps[k:]
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE fenceq_jobs`); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkClaimCompleteMany claims a batch of 100 jobs and completes them with one
// fenced CompleteMany; reported per job.
func BenchmarkClaimCompleteMany(b *testing.B) {
	db, ctx := benchDB(b)
	const batch = 100
	fill(b, db, ctx, b.N*batch)
	b.ResetTimer()
	var cursor *store.ClaimCursor
	for range b.N {
		jobs, err := store.Claim(ctx, db.Pool, store.ClaimParams{Queue: queue.DefaultQueue, WorkerID: "bench",
			Limit: batch, Lease: time.Minute, After: cursor})
		if err != nil || len(jobs) != batch {
			b.Fatalf("claim: %d jobs, %v", len(jobs), err)
		}
		cursor = store.CursorAfter(jobs)
		leases := make([]queue.Lease, len(jobs))
		for i, j := range jobs {
			leases[i] = store.LeaseOf(j)
		}
		lost, err := store.CompleteMany(ctx, db.Pool, "bench", leases)
		if err != nil || len(lost) != 0 {
			b.Fatalf("complete: lost %d, %v", len(lost), err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/job")
}

// BenchmarkInsert enqueues one job per statement.
func BenchmarkInsert(b *testing.B) {
	db, ctx := benchDB(b)
	b.ResetTimer()
	for i := range b.N {
		if _, err := store.Insert(ctx, db.Pool, store.InsertParams{Kind: "bench", Args: []byte(fmt.Sprintf(`{"n":%d}`, i))}); err != nil {
			b.Fatalf("insert: %v", err)
		}
	}
}

// BenchmarkInsertManyCOPY enqueues batches of 1,000 jobs with COPY; reported per job.
func BenchmarkInsertManyCOPY(b *testing.B) {
	db, ctx := benchDB(b)
	const batch = 1000
	ps := make([]store.InsertParams, batch)
	for i := range ps {
		ps[i] = store.InsertParams{Kind: "bench", Args: []byte(fmt.Sprintf(`{"n":%d}`, i))}
	}
	b.ResetTimer()
	for range b.N {
		if n, err := store.InsertMany(ctx, db.Pool, ps); err != nil || n != batch {
			b.Fatalf("insert many: %d, %v", n, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/job")
}

// BenchmarkHeartbeat100 renews 100 leases in one statement.
func BenchmarkHeartbeat100(b *testing.B) {
	db, ctx := benchDB(b)
	fill(b, db, ctx, 100)
	if err := store.RegisterWorker(ctx, db.Pool, "bench", "host", 1, []string{queue.DefaultQueue}, nil); err != nil {
		b.Fatal(err)
	}
	jobs, err := store.Claim(ctx, db.Pool, store.ClaimParams{Queue: queue.DefaultQueue, WorkerID: "bench", Limit: 100, Lease: time.Minute})
	if err != nil || len(jobs) != 100 {
		b.Fatalf("claim: %d, %v", len(jobs), err)
	}
	leases := make([]queue.Lease, len(jobs))
	for i, j := range jobs {
		leases[i] = store.LeaseOf(j)
	}
	b.ResetTimer()
	for range b.N {
		res, err := store.Heartbeat(ctx, db.Pool, "bench", leases, time.Minute)
		if err != nil || len(res.Renewed) != 100 {
			b.Fatalf("heartbeat: %d renewed, %v", len(res.Renewed), err)
		}
	}
}

// BenchmarkWithLeaseCommit is one fenced commit of a claimed job with one row written
// in its function (the job's lock, the row, the completion, COMMIT), on a pool
// (pipelined: one round trip besides the row's) and on a Beginner that is not one
// (one statement per round trip), with 200 other jobs running; reported per commit.
func BenchmarkWithLeaseCommit(b *testing.B) {
	for _, name := range []string{"pool", "beginner"} {
		b.Run(name, func(b *testing.B) {
			db, ctx := benchDB(b)
			if _, err := db.Pool.Exec(ctx, `CREATE TABLE results (job_id bigint PRIMARY KEY)`); err != nil {
				b.Fatal(err)
			}
			fill(b, db, ctx, b.N+200)
			jobs, err := store.Claim(ctx, db.Pool, store.ClaimParams{Queue: queue.DefaultQueue, WorkerID: "bench",
				Limit: b.N + 200, Lease: time.Hour})
			if err != nil || len(jobs) != b.N+200 {
				b.Fatalf("claim: %d jobs, %v", len(jobs), err)
			}
			var db2 queue.Beginner = db.Pool
			if name == "beginner" {
				db2 = beginnerOnly{db.Pool}
			}
			b.ResetTimer()
			for i := range b.N {
				l := store.LeaseOf(jobs[i])
				if err := store.WithLease(ctx, db2, l, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO results VALUES ($1)`, l.JobID)
					return err
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkClaimFlowPileup measures the flow claim as jobs pile up behind a full
// partition: one partition of a limit of one running job holds its slot, with pileup
// jobs waiting behind it ahead (in key order) of 100 partitions with one job each. Each
// iteration claims the 100 in a transaction it then rolls back, so every iteration
// finds the same jobs. The time per claim should not grow with the pile:
//
//	go test -run '^$' -bench ClaimFlowPileup -benchtime 200x ./internal/store/
func BenchmarkClaimFlowPileup(b *testing.B) {
	for _, pileup := range []int{0, 10_000, 100_000} {
		b.Run(fmt.Sprintf("pileup=%d", pileup), func(b *testing.B) {
			db, ctx := benchDB(b)
			if err := store.SetFlowLimit(ctx, db.Pool, queue.FlowLimit{Name: "b", MaxRunning: 1}); err != nil {
				b.Fatal(err)
			}
			ps := []store.InsertParams{{Kind: "bench", FlowKey: "b:0000"}}
			for range pileup {
				ps = append(ps, store.InsertParams{Kind: "bench", FlowKey: "b:0000"})
			}
			for i := 1; i <= 100; i++ {
				ps = append(ps, store.InsertParams{Kind: "bench", FlowKey: fmt.Sprintf("b:%04d", i)})
			}
			for len(ps) > 0 {
				k := min(len(ps), 5000)
				if _, err := store.InsertMany(ctx, db.Pool, ps[:k]); err != nil {
					b.Fatalf("fill: %v", err)
				}
				ps = ps[k:]
			}
			claim := func(db queue.DBTX, n int) []*queue.JobRow {
				jobs, _, err := store.ClaimFlow(ctx, db, store.ClaimFlowParams{WorkerID: "bench", Lease: time.Minute,
					Queues: []store.QueueClaim{{Name: queue.DefaultQueue, Limit: n}}, Max: n})
				if err != nil {
					b.Fatal(err)
				}
				return jobs
			}
			// The first claim fills partition b:0000's only slot.
			if got := claim(db.Pool, 1); len(got) != 1 || *got[0].FlowKey != "b:0000" {
				b.Fatalf("first claim: %v", got)
			}
			if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE fenceq_jobs_hot`); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				tx, err := db.Pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if got := claim(tx, 100); len(got) != 100 {
					b.Fatalf("claimed %d, want the 100 partitions with room", len(got))
				}
				if err := tx.Rollback(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
