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
	"github.com/fenceq/fenceq/internal/store"
)

// A worker's claim is told by its batch of queues (WITH q AS MATERIALIZED), or on
// Citus, where it claims each queue with a statement of its own, by the CTE of that
// statement (WITH next AS): the reaper, the promotion of due jobs and the pruning lock
// rows with SKIP LOCKED too, and are not claims. The floor lookup is told by its
// filter on kinds.
const (
	claimMarker    = "WITH q AS MATERIALIZED ("
	oneClaimMarker = "WITH next AS ("
	floorMarker    = "AND kind <> ALL("
)

// isClaim reports whether sql is a worker's claim, of many queues or of one.
func isClaim(sql string) bool {
	return strings.Contains(sql, claimMarker) || strings.Contains(sql, oneClaimMarker)
}

// claimStarts counts the queues of a claim statement that start from the start of the
// claim order and those that start after a position (a cursor or a floor).
func claimStarts(d pgx.TraceQueryStartData) (fromStart, after int) {
	if !strings.Contains(d.SQL, claimMarker) {
		if strings.Contains(d.SQL, "(priority, run_at, id) >") {
			return 0, 1
		}
		return 1, 0
	}
	for _, id := range claimCursors(d.Args) {
		if id != nil {
			after++
		} else {
			fromStart++
		}
	}
	return fromStart, after
}

// claimQueues returns the queues a claim statement's arguments list: the first string
// slice among them.
func claimQueues(args []any) []string {
	for _, a := range args {
		if s, ok := a.([]string); ok {
			return s
		}
	}
	return nil
}

// claimCursors returns the cursor ids a claim statement's arguments carry, one per
// queue (nil for a claim from the start of the order).
func claimCursors(args []any) []*int64 {
	for _, a := range args {
		if s, ok := a.([]*int64); ok {
			return s
		}
	}
	return nil
}

// claimsInFlight tracks the claim statements in flight on a pool and the most that
// were in flight at once, the queues each claim listed and the floor lookups.
type claimsInFlight struct {
	mu           sync.Mutex
	now, most, n int
	withRows     int   // claims that returned at least one row
	mostRows     int   // the most jobs one claim returned
	queues       []int // per claim of many queues, the queues it listed
	floors       int   // floor lookups
}

type claimKey struct{}

func (c *claimsInFlight) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, floorMarker) {
		c.mu.Lock()
		c.floors++
		c.mu.Unlock()
		return ctx
	}
	if !isClaim(d.SQL) {
		return ctx
	}
	c.mu.Lock()
	c.now++
	c.n++
	c.most = max(c.most, c.now)
	if strings.Contains(d.SQL, claimMarker) {
		c.queues = append(c.queues, len(claimQueues(d.Args)))
	}
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
	c.mostRows = max(c.mostRows, int(d.CommandTag.RowsAffected()))
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

// perQueueRunning counts the handlers running per queue and the most that ever ran at
// once in any one queue.
type perQueueRunning struct {
	mu      sync.Mutex
	running map[string]int
	most    map[string]int
}

func (p *perQueueRunning) begin(q string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running[q]++
	p.most[q] = max(p.most[q], p.running[q])
}

func (p *perQueueRunning) end(q string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running[q]--
}

// mostInAnyQueue returns the most handlers that ran at once in one queue, and that
// queue.
func (p *perQueueRunning) mostInAnyQueue() (int, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, q := 0, ""
	for name, m := range p.most {
		if m > n {
			n, q = m, name
		}
	}
	return n, q
}

// A worker serving many queues claims for all of them with one claim in flight at a
// time, so the completer and the heartbeat always find a connection of a small pool;
// every job of every queue is worked once, no queue runs more than its MaxWorkers at
// once, claims take jobs of several queues in one statement, and a paused queue in
// the middle of the list gets nothing.
func TestManyQueuesOneClaimInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const queues, perQueue, jobs, paused = 200, 1, 2000, "q100"
	ran, running := spreadJobs(t, b, queues, jobs, "q%03d")
	if err := store.SetQueuePaused(b.ctx, b.db.Pool, paused, true); err != nil {
		t.Fatal(err)
	}
	const pausedJobs, want = jobs / queues, jobs - jobs/queues
	tr := &claimsInFlight{}
	pool := b.tracedPool(t, tr, 4)
	cfg := b.fastConfig(30 * time.Second)
	cfg.Queues = map[string]fenceq.QueueConfig{}
	for i := range queues {
		cfg.Queues[fmt.Sprintf("q%03d", i)] = fenceq.QueueConfig{MaxWorkers: perQueue}
	}
	fenceqtest.StartWorker(b.ctx, t, pool, cfg)

	fenceqtest.WaitFor(t, "every handler of the unpaused queues to run", time.Minute, func() bool { return ran.Load() >= want })
	var completed, once, pausedUntouched int
	// The handlers have all run; their completions are written in batches after.
	fenceqtest.WaitFor(t, "every completion to be written", time.Minute, func() bool {
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE state = 'completed'),
		    count(*) FILTER (WHERE state = 'completed' AND attempt = 1 AND lease_gen = 1),
		    count(*) FILTER (WHERE queue = $1 AND state = 'available' AND attempt = 0 AND lease_gen = 0)
		    FROM fenceq_jobs`, paused).Scan(&completed, &once, &pausedUntouched); err != nil {
			t.Fatal(err)
		}
		return completed >= want
	})
	most, n, withRows := tr.read()
	if got := ran.Load(); got != want || completed != want || once != want || pausedUntouched != pausedJobs {
		t.Fatalf("handlers ran %d times, %d jobs completed, %d at their first attempt, want %d each; %d of the paused queue's jobs untouched, want %d",
			got, completed, once, want, pausedUntouched, pausedJobs)
	}
	if most != 1 {
		t.Fatalf("at most %d claims in flight at once (%d claims), want 1", most, n)
	}
	if m, q := running.mostInAnyQueue(); m != perQueue {
		t.Fatalf("queue %s ran %d handlers at once, want at most (and at some point) %d", q, m, perQueue)
	}
	// The jobs of one claim share its attempted_at (the claim's now()). On Citus each
	// queue has a claim of its own.
	var mixed int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM (SELECT attempted_at FROM fenceq_jobs
	    WHERE state = 'completed' GROUP BY attempted_at HAVING count(DISTINCT queue) > 1) x`).Scan(&mixed); err != nil {
		t.Fatal(err)
	}
	if mixed == 0 && !fenceqtest.OnCitus(t) {
		t.Fatalf("no claim took jobs of more than one queue (%d claims for %d jobs)", n, want)
	}
	t.Logf("%d claims (%d with rows, %d of several queues) for %d jobs in %d queues", n, withRows, mixed, want, queues)
}

// An idle worker's claims cost the same per poll whatever the number of its queues:
// each poll is one claim statement listing every queue, even when their limits add up
// to more than ClaimBatchSize (300 queues of 10 slots claim up to 5 each), and the
// floor lookup, when there is one, is one statement for all of them.
func TestIdlePollIsOneClaimWhateverTheQueues(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "a worker on Citus claims each queue with a statement of its own")
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil }, nil)
	const polls = 20
	measure := func(id string, queues int) (claims, floors int) {
		tr := &claimsInFlight{}
		pool := b.tracedPool(t, tr, 4)
		cfg := b.fastConfig(30 * time.Second)
		cfg.ID, cfg.PollInterval, cfg.DisableListen = id, 5*time.Millisecond, true
		cfg.Queues = map[string]fenceq.QueueConfig{}
		for i := range queues {
			cfg.Queues[fmt.Sprintf("%s-%03d", id, i)] = fenceq.QueueConfig{MaxWorkers: 10}
		}
		w := fenceqtest.StartWorker(b.ctx, t, pool, cfg)
		fenceqtest.WaitFor(t, fmt.Sprintf("%d polls of %d queues", polls, queues), time.Minute, func() bool { return tr.ended() >= polls })
		if err := w.Stop(b.ctx); err != nil {
			t.Fatal(err)
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for i, q := range tr.queues {
			if q != queues {
				t.Fatalf("worker of %d queues: claim %d listed %d queues, want all", queues, i, q)
			}
		}
		if tr.floors > tr.n {
			t.Fatalf("worker of %d queues: %d floor lookups for %d polls, want at most one per poll", queues, tr.floors, tr.n)
		}
		return tr.n, tr.floors
	}
	oneClaims, oneFloors := measure("one", 1)
	manyClaims, manyFloors := measure("many", 300)
	t.Logf("1 queue: %d claims, %d floor lookups; 300 queues: %d claims, %d floor lookups", oneClaims, oneFloors, manyClaims, manyFloors)
}

// A claim takes at most ClaimBatchSize jobs in all, and the queues it stopped before are
// claimed from by the next round first: with many queues of more free slots than the
// batch, every job is still worked, no queue runs more than its MaxWorkers at once, and
// no claim takes more than the batch (the first takes the batch exactly: every queue
// has a backlog).
func TestClaimRoundsShareTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const queues, perQueue, jobs, batch = 30, 4, 600, 7
	ran, running := spreadJobs(t, b, queues, jobs, "q%02d")
	tr := &claimsInFlight{}
	pool := b.tracedPool(t, tr, 4)
	cfg := b.fastConfig(30 * time.Second)
	cfg.ClaimBatchSize = batch
	cfg.Queues = map[string]fenceq.QueueConfig{}
	for i := range queues {
		cfg.Queues[fmt.Sprintf("q%02d", i)] = fenceq.QueueConfig{MaxWorkers: perQueue}
	}
	fenceqtest.StartWorker(b.ctx, t, pool, cfg)
	fenceqtest.WaitFor(t, "every handler to run", time.Minute, func() bool { return ran.Load() >= jobs })
	if got := ran.Load(); got != jobs {
		t.Fatalf("handlers ran %d times, want %d", got, jobs)
	}
	tr.mu.Lock()
	mostRows, n := tr.mostRows, tr.n
	tr.mu.Unlock()
	// On Citus each queue has a claim of its own, of at most its limit.
	if mostRows > batch || (mostRows != batch && !fenceqtest.OnCitus(t)) {
		t.Fatalf("the largest of %d claims took %d jobs, want ClaimBatchSize %d", n, mostRows, batch)
	}
	if m, q := running.mostInAnyQueue(); m > perQueue {
		t.Fatalf("queue %s ran %d handlers at once, want at most %d", q, m, perQueue)
	}
}

// spreadJobs registers a handler that counts the jobs it ran and the jobs running in each
// queue at once, and enqueues jobs spread round robin over queues named by format.
func spreadJobs(t *testing.T, b *testBundle, queues, jobs int, format string) (*atomic.Int64, *perQueueRunning) {
	t.Helper()
	ran := &atomic.Int64{}
	running := &perQueueRunning{running: map[string]int{}, most: map[string]int{}}
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error {
		running.begin(job.Queue)
		defer running.end(job.Queue)
		ran.Add(1)
		return nil
	}, nil)
	items := make([]fenceq.EnqueueItem, jobs)
	for i := range items {
		items[i] = fenceq.EnqueueItem{Args: echoArgs{Value: "x"}, Opts: &fenceq.InsertOpts{Queue: fmt.Sprintf(format, i%queues)}}
	}
	if n, err := fenceq.EnqueueMany(b.ctx, b.db.Pool, items); err != nil || n != int64(jobs) {
		t.Fatalf("enqueue: %d %v", n, err)
	}
	return ran, running
}
