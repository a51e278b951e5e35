package fenceq_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

type ghostArgs struct{}

func (ghostArgs) Kind() string { return "ghost" }

// A worker without a handler for a kind leaves its jobs available with attempt 0 (a
// rolling deploy: an old worker, a job of a new kind); it records the kinds it runs, and
// a worker that knows the kind runs the job.
func TestWorkerLeavesUnknownKindsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil }, nil)
	ghost, err := fenceq.Enqueue(b.ctx, b.db.Pool, ghostArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	echo, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{Value: "after the ghost"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := b.fastConfig(2 * time.Second)
	cfg.ID = "old-worker"
	b.startWorker(t, cfg)
	fenceqtest.WaitState(t, b.db.Pool, echo.Job.ID, queue.StateCompleted, 10*time.Second)
	// The old worker claimed past the ghost (it is ahead in claim order) and since then
	// has looked from the start of the queue at least once more (PollInterval 50ms).
	var kinds []string
	fenceqtest.WaitFor(t, "a few more polls", 5*time.Second, func() bool {
		var polls int
		err := b.db.Pool.QueryRow(b.ctx, `SELECT kinds, (extract(epoch FROM now() - started_at) * 1000)::int FROM fenceq_workers WHERE id = 'old-worker'`).Scan(&kinds, &polls)
		return err == nil && polls > 500
	})
	if !slices.Equal(kinds, []string{"echo"}) {
		t.Fatalf("fenceq_workers.kinds = %v, want [echo]", kinds)
	}
	j, err := store.GetJob(b.ctx, b.db.Pool, ghost.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != queue.StateAvailable || j.Attempt != 0 || j.LeaseGen != 0 || len(j.Errors) != 0 {
		t.Fatalf("ghost job after the old worker: %s attempt %d gen %d errors %v; want it untouched", j.State, j.Attempt, j.LeaseGen, j.Errors)
	}
	unknown, err := store.ListJobs(b.ctx, b.db.Pool, queue.ListParams{JobFilter: queue.JobFilter{UnknownKinds: true}})
	if err != nil || len(unknown) != 1 || unknown[0].ID != ghost.Job.ID {
		t.Fatalf("unknown kinds: %v %v, want the ghost job", unknown, err)
	}

	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[ghostArgs]) error { return nil }, nil)
	cfg2 := b.fastConfig(2 * time.Second)
	cfg2.Handlers, cfg2.ID = hs, "new-worker"
	b.startWorker(t, cfg2)
	done := fenceqtest.WaitState(t, b.db.Pool, ghost.Job.ID, queue.StateCompleted, 10*time.Second)
	if done.Attempt != 1 || done.LeasedBy == nil || *done.LeasedBy != "new-worker" {
		t.Fatalf("ghost job: attempt %d by %v, want attempt 1 by new-worker", done.Attempt, done.LeasedBy)
	}
}

// claimTracer counts the queues' claims a worker sends: those starting from the start of
// the claim order and those starting after a position (a cursor or a floor).
type claimTracer struct {
	mu                sync.Mutex
	fromStart, behind int
}

func (c *claimTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !isClaim(d.SQL) || !strings.Contains(d.SQL, "kind = ANY(") {
		return ctx
	}
	fromStart, after := claimStarts(d)
	c.mu.Lock()
	c.fromStart += fromStart
	c.behind += after
	c.mu.Unlock()
	return ctx
}

func (c *claimTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *claimTracer) counts() (fromStart, after int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fromStart, c.behind
}

// A queue whose head holds many jobs of a kind the worker has no handler for: the
// worker's claims, woken by every insert, start after the last of them (the floor), and
// only the look behind, at most once per PollInterval, walks them from the start. The
// known jobs behind them are all worked, the others never touched.
func TestClaimsDoNotRewalkUnknownKindsAtTheHead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ghosts, echoes = 2000, 20
	items := make([]fenceq.EnqueueItem, ghosts)
	for i := range items {
		items[i] = fenceq.EnqueueItem{Args: ghostArgs{}, Opts: &fenceq.InsertOpts{Priority: new(0)}}
	}
	if n, err := fenceq.EnqueueMany(b.ctx, b.db.Pool, items); err != nil || n != ghosts {
		t.Fatalf("enqueue ghosts: %d %v", n, err)
	}
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil }, nil)
	tr := &claimTracer{}
	pool := b.tracedPool(t, tr, 4)
	cfg := b.fastConfig(5 * time.Second)
	cfg.PollInterval = 500 * time.Millisecond
	start := time.Now()
	fenceqtest.StartWorker(b.ctx, t, pool, cfg)
	for range echoes {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{Value: "x"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, 10*time.Second)
	}
	elapsed := time.Since(start)
	fromStart, after := tr.counts()
	// Every wake-up claims; only the look behind starts from the start: once per
	// PollInterval (plus the first claim and a poll tick racing a wake-up).
	if limit := int(elapsed/cfg.PollInterval) + 3; fromStart > limit {
		t.Fatalf("%d claims from the start in %s (PollInterval %s), want at most %d; %d after a position",
			fromStart, elapsed.Round(time.Millisecond), cfg.PollInterval, limit, after)
	}
	if after < echoes/2 {
		t.Fatalf("only %d claims after the floor (and %d from the start) for %d jobs: the floor was not used", after, fromStart, echoes)
	}
	var touched int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs WHERE kind = 'ghost' AND (state <> 'available' OR attempt <> 0 OR lease_gen <> 0)`).Scan(&touched); err != nil {
		t.Fatal(err)
	}
	if touched != 0 {
		t.Fatalf("%d ghost jobs were touched", touched)
	}
	t.Logf("%d jobs in %s: %d claims from the start, %d after a position", echoes, elapsed.Round(time.Millisecond), fromStart, after)
}
