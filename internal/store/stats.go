package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/fenceq/fenceq/queue"
	"github.com/jackc/pgx/v5"
)

// Reads for dashboards and reports that must stay cheap however many jobs are retained:
// unfinished jobs are counted in the hot set through the partial indexes of their states,
// each scan bounded by a cap, and finished jobs are read from the counters RollupCounts
// maintains (fenceq_job_counts), never from history.

// withoutJIT runs fn in a read-only transaction with JIT compilation off. The planner's
// estimates for these reads (a cap of rows, each row's errors expanded) pass JIT's cost
// threshold though they read a few thousand rows, and compiling them takes longer than
// running them. db is used as it is when it cannot begin a transaction.
func withoutJIT(ctx context.Context, db queue.DBTX, fn func(queue.DBTX) error) error {
	b, ok := db.(interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	})
	if !ok {
		return fn(db)
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL jit = off`); err != nil {
		return fmt.Errorf("turn JIT off: %w", err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func normalizeCount(p *queue.CountParams) error {
	if p.Window == 0 {
		p.Window = time.Hour
	}
	if p.Window < 0 || p.Window > CounterRetention {
		return invalid("window", "%s is outside 0–%s, the counters' retention", p.Window, CounterRetention)
	}
	if p.Cap == 0 {
		p.Cap = queue.DefaultCountCap
	}
	if p.Cap < 0 {
		return invalid("cap", "%d is negative", p.Cap)
	}
	return nil
}

// CountQueues counts jobs per queue without reading history: unfinished jobs by state
// in the hot set through the partial indexes of those states, finished jobs from the
// counters of the window's minutes (the window rounded out to the start of its first
// minute; as fresh as the last RollupCounts). Queues are those with settings
// (fenceq_queues), unfinished jobs, or jobs counted as finished within the window, by
// name.
func CountQueues(ctx context.Context, db queue.DBTX, p queue.CountParams) (*queue.QueueCounts, error) {
	if err := normalizeCount(&p); err != nil {
		return nil, err
	}
	var out *queue.QueueCounts
	err := withoutJIT(ctx, db, func(db queue.DBTX) error {
		var err error
		out, err = countQueues(ctx, db, p)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("count jobs per queue: %w", err)
	}
	return out, nil
}

func countQueues(ctx context.Context, db queue.DBTX, p queue.CountParams) (*queue.QueueCounts, error) {
	rows, err := db.Query(ctx, sqlCountQueues, customPlan, micros(p.Window), p.Cap)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := &queue.QueueCounts{Window: p.Window, Capped: []queue.State{}}
	byName := map[string]*queue.QueueCount{}
	get := func(name string) *queue.QueueCount {
		q, ok := byName[name]
		if !ok {
			q = &queue.QueueCount{Name: name, Unfinished: map[queue.State]int64{}, Finished: map[queue.State]int64{}}
			for _, st := range unfinishedStates {
				q.Unfinished[st] = 0
			}
			for _, st := range finalStates {
				q.Finished[st] = 0
			}
			byName[name] = q
		}
		return q
	}
	groupTotal := map[string]int64{}
	groupStates := map[string][]queue.State{}
	for rows.Next() {
		var group, name string
		var state *string
		var n int64
		var paused *bool
		if err := rows.Scan(&group, &name, &state, &n, &paused); err != nil {
			return nil, err
		}
		q := get(name)
		if paused != nil {
			q.Paused = *paused
		}
		if state == nil {
			continue
		}
		st := queue.State(*state)
		if st.Final() {
			q.Finished[st] += n
		} else {
			q.Unfinished[st] += n
		}
		if group == "finished" {
			continue // counters, not a capped scan
		}
		groupTotal[group] += n
		if !slices.Contains(groupStates[group], st) {
			groupStates[group] = append(groupStates[group], st)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for g, n := range groupTotal {
		if n >= int64(p.Cap) {
			out.Capped = append(out.Capped, groupStates[g]...)
		}
	}
	slices.Sort(out.Capped)
	for _, q := range byName {
		out.Queues = append(out.Queues, *q)
	}
	slices.SortFunc(out.Queues, func(a, b queue.QueueCount) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out, nil
}

// ReadThroughput counts finished jobs and failed attempts per interval over the
// window, in buckets intervals of whole minutes aligned to whole multiples of the bucket
// length (the last one is the current, partial, interval). Finished jobs, and the failed
// attempts of finished jobs (in the interval each job finished in), come from the
// counters (as fresh as the last RollupCounts); the failed attempts of jobs scheduled,
// retryable or running now from their errors in the hot set, in the interval each was
// recorded in. A failed attempt of a job that now waits, available, for
// its next attempt is counted once that attempt begins.
func ReadThroughput(ctx context.Context, db queue.DBTX, p queue.CountParams, buckets int) (*queue.Throughput, error) {
	if err := normalizeCount(&p); err != nil {
		return nil, err
	}
	if buckets < 1 || buckets > 1000 {
		return nil, invalid("buckets", "%d is outside 1–1000", buckets)
	}
	bucket := p.Window / time.Duration(buckets)
	if bucket < CounterBucket || bucket%CounterBucket != 0 {
		return nil, invalid("window", "%s in %d buckets makes buckets of %s, not whole minutes", p.Window, buckets, bucket)
	}
	out := &queue.Throughput{Bucket: bucket, Buckets: make([]queue.ThroughputBucket, buckets)}
	err := withoutJIT(ctx, db, func(db queue.DBTX) error { return readThroughput(ctx, db, p, out) })
	if err != nil {
		return nil, fmt.Errorf("read throughput: %w", err)
	}
	return out, nil
}

func readThroughput(ctx context.Context, db queue.DBTX, p queue.CountParams, out *queue.Throughput) error {
	buckets := len(out.Buckets)
	rows, err := db.Query(ctx, sqlThroughput, customPlan, micros(out.Bucket), buckets, p.Cap)
	if err != nil {
		return err
	}
	defer rows.Close()
	var first time.Time
	for rows.Next() {
		var b queue.ThroughputBucket
		var i int
		var scanned int64
		if err := rows.Scan(&out.Now, &first, &i, &b.Completed, &b.Discarded, &b.Cancelled, &b.Failed, &scanned); err != nil {
			return err
		}
		if scanned >= int64(p.Cap) {
			out.Capped = true
		}
		if i >= 0 && i < buckets {
			out.Buckets[i] = b
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range out.Buckets {
		out.Buckets[i].Start = first.Add(time.Duration(i) * out.Bucket)
	}
	return nil
}

// ReadActivity reads the oldest open transaction of the current database, leaving out
// the caller's own session; on a Citus coordinator, of every node
// (citus_stat_activity). An old transaction holds back vacuum's horizon: dead job rows
// pile up and every index scan slows.
func ReadActivity(ctx context.Context, db queue.DBTX) (queue.Activity, error) {
	var a queue.Activity
	var age float64
	err := onConn(ctx, db, func(db queue.DBTX, dist bool) error {
		q := sqlActivity
		if dist {
			q = sqlActivityCitus
		}
		return db.QueryRow(ctx, q).Scan(&age, &a.IdleInTransaction)
	})
	if err != nil {
		return queue.Activity{}, fmt.Errorf("read open transactions: %w", err)
	}
	a.OldestTransactionAge = time.Duration(age * float64(time.Second))
	return a, nil
}

// DBNow returns the database's now(): the clock every decision uses, and the one
// against which a dashboard shows ages.
func DBNow(ctx context.Context, db queue.DBTX) (time.Time, error) {
	var t time.Time
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read the database clock: %w", err)
	}
	return t, nil
}
