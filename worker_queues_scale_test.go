package fenceq_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
)

// claimsInFlight tracks the claim statements in flight on a pool and the most that
// were in flight at once. A claim is told by its CTE (WITH next AS): the reaper, the
// promotion of due jobs and the pruning lock rows with SKIP LOCKED too, and are not
// claims.
type claimsInFlight struct {
	mu           sync.Mutex
	now, most, n int
	withRows     int // claims that returned at least one row
}

type claimKey struct{}

func (c *claimsInFlight) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "WITH next AS (") {
		return ctx
	}
	c.mu.Lock()
	c.now++
	c.n++
	c.most = max(c.most, c.now)
	c.mu.Unlock()
	return context.WithValue(ctx, claimKey{}, true)
}

func (c *claimsInFlight) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ctx.Value(claimKey{}) == nil {
		return
	}
	c.mu.Lock()
	c.now--
	if d.CommandTag.RowsAffected() > 0 {
		c.withRows++
	}
	c.mu.Unlock()
}

// ended is the number of claims that have returned.
func (c *claimsInFlight) ended() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n - c.now
}

func (c *claimsInFlight) read() (most, n, withRows int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.most, c.n, c.withRows
}

// A worker serving many queues on a small pool runs at most half the pool's
// connections of claims at once, so the completer and the heartbeat always find a
// connection; every job of every queue is still worked, once.
func TestManyQueuesClaimAtMostHalfThePool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const queues, perQueue, jobs = 40, 4, 2000
	var ran atomic.Int64
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error {
		ran.Add(1)
		return nil
	}, nil)
	items := make([]fenceq.EnqueueItem, jobs)
	for i := range items {
		items[i] = fenceq.EnqueueItem{Args: echoArgs{Value: "x"}, Opts: &fenceq.InsertOpts{Queue: fmt.Sprintf("q%02d", i%queues)}}
	}
	if n, err := fenceq.EnqueueMany(b.ctx, b.db.Pool, items); err != nil || n != jobs {
		t.Fatalf("enqueue: %d %v", n, err)
	}
	tr := &claimsInFlight{}
	pool := b.tracedPool(t, tr, 4)
	cfg := b.fastConfig(30 * time.Second)
	cfg.Queues = map[string]fenceq.QueueConfig{}
	for i := range queues {
		cfg.Queues[fmt.Sprintf("q%02d", i)] = fenceq.QueueConfig{MaxWorkers: perQueue}
	}
	fenceqtest.StartWorker(b.ctx, t, pool, cfg)

	fenceqtest.WaitFor(t, "every handler to run", time.Minute, func() bool { return ran.Load() >= jobs })
	var completed, once int
	// The handlers have all run; their completions are written in batches after.
	fenceqtest.WaitFor(t, "every completion to be written", time.Minute, func() bool {
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE state = 'completed'),
		    count(*) FILTER (WHERE state = 'completed' AND attempt = 1 AND lease_gen = 1) FROM fenceq_jobs`).Scan(&completed, &once); err != nil {
			t.Fatal(err)
		}
		return completed >= jobs
	})
	most, n, withRows := tr.read()
	if got := ran.Load(); got != jobs || completed != jobs || once != jobs {
		t.Fatalf("handlers ran %d times, %d jobs completed, %d at their first attempt; want %d each", got, completed, once, jobs)
	}
	// Forty claim loops with a backlog each asked for a turn at once: the limit was
	// reached, and never passed.
	if most != 2 {
		t.Fatalf("at most %d claims in flight at once on a pool of 4 (%d claims), want 2", most, n)
	}
	t.Logf("%d claims (%d with rows) for %d jobs in %d queues, at most %d at once", n, withRows, jobs, queues, most)
}
