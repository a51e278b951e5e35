package fenceq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// hookEvent is one call of a hook method, as recorder saw it.
type hookEvent struct {
	what   string // started, finished, lost, stale
	jobID  int64
	gen    int64
	res    fenceq.AttemptResult
	op     string
	alive  bool
	ctxVal any // the value of mwKey{} in the hook's context
}

// recorder implements every hook and records the job events in order.
type recorder struct {
	mu     sync.Mutex
	events []hookEvent
	signal chan hookEvent // every event, when not nil
}

func (r *recorder) add(ctx context.Context, e hookEvent) {
	e.ctxVal = ctx.Value(mwKey{})
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
	if r.signal != nil {
		r.signal <- e
	}
}

func (r *recorder) of(jobID int64) []hookEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []hookEvent
	for _, e := range r.events {
		if e.jobID == jobID {
			out = append(out, e)
		}
	}
	return out
}

func (r *recorder) JobStarted(ctx context.Context, job *queue.JobRow) {
	r.add(ctx, hookEvent{what: "started", jobID: job.ID, gen: job.LeaseGen})
}

func (r *recorder) JobFinished(ctx context.Context, job *queue.JobRow, res fenceq.AttemptResult) {
	r.add(ctx, hookEvent{what: "finished", jobID: job.ID, gen: job.LeaseGen, res: res})
}

func (r *recorder) LeaseLost(ctx context.Context, job *queue.JobRow, holderAlive bool) {
	r.add(ctx, hookEvent{what: "lost", jobID: job.ID, gen: job.LeaseGen, alive: holderAlive})
}

func (r *recorder) StaleWriteRejected(ctx context.Context, job *queue.JobRow, op string) {
	r.add(ctx, hookEvent{what: "stale", jobID: job.ID, gen: job.LeaseGen, op: op})
}

func (r *recorder) LeaseRevoked(ctx context.Context, rev queue.Revocation) {}

func (r *recorder) HeartbeatFailed(ctx context.Context, err error) {}

var (
	_ fenceq.JobStartedHook         = (*recorder)(nil)
	_ fenceq.JobFinishedHook        = (*recorder)(nil)
	_ fenceq.LeaseLostHook          = (*recorder)(nil)
	_ fenceq.StaleWriteRejectedHook = (*recorder)(nil)
	_ fenceq.LeaseRevokedHook       = (*recorder)(nil)
	_ fenceq.HeartbeatFailedHook    = (*recorder)(nil)
)

type hookArgs struct {
	Mode string `json:"mode"`
}

func (hookArgs) Kind() string { return "hooked" }

// The hooks hear of each attempt's start and end with its row, its outcome and the
// error behind it, in the context its middleware handed on; of a lease a heartbeat
// found revoked; and of the write the fence then rejected — in that order.
func TestHooksFire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	waiting := make(chan int64, 1)
	release := make(chan struct{})
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[hookArgs]) error {
		switch job.Args.Mode {
		case "fail":
			return errors.New("tax service down")
		case "quit": // returns as soon as its context is cancelled
			waiting <- job.ID
			<-ctx.Done()
			return context.Cause(ctx)
		case "stall":
			waiting <- job.ID
			<-release // ignores its cancelled context, then tries to commit
			return job.Commit(context.WithoutCancel(ctx), func(ctx context.Context, tx pgx.Tx) error { return nil })
		}
		return nil
	}, nil)
	cfg := b.fastConfig(3 * time.Second)
	cfg.HeartbeatInterval = 100 * time.Millisecond
	cfg.ReaperInterval = time.Minute // only the operator revokes here
	cfg.Hooks = []fenceq.Hook{rec}
	cfg.Queues = map[string]fenceq.QueueConfig{"ok": {}, "fail": {}, "quit": {}, "stall": {}}
	cfg.Middleware = []fenceq.Middleware{func(ctx context.Context, job *queue.JobRow, next func(context.Context) error) error {
		return next(context.WithValue(ctx, mwKey{}, fmt.Sprintf("mw of %d", job.ID)))
	}}
	b.startWorker(t, cfg)

	enqueue := func(mode string) int64 {
		// Each mode on a queue of its own, which revoke pauses.
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, hookArgs{Mode: mode}, &fenceq.InsertOpts{MaxAttempts: 1, Queue: mode})
		if err != nil {
			t.Fatal(err)
		}
		return res.Job.ID
	}
	ok, fail := enqueue("ok"), enqueue("fail")

	t.Run("Completed", func(t *testing.T) {
		fenceqtest.WaitState(t, b.db.Pool, ok, queue.StateCompleted, 10*time.Second)
		evs := waitEvents(t, rec, ok, 2)
		if evs[0].what != "started" || evs[0].gen != 1 || evs[1].what != "finished" || evs[1].gen != 1 {
			t.Fatalf("events %+v, want started and finished at gen 1", evs)
		}
		r := evs[1].res
		if r.Outcome != fenceq.OutcomeCompleted || r.Err != nil || r.Duration <= 0 {
			t.Errorf("finished %+v, want completed without error", r)
		}
		if evs[0].ctxVal != nil || evs[1].ctxVal != fmt.Sprintf("mw of %d", ok) {
			t.Errorf("context values %v, %v: want none at the start, the middleware's at the end", evs[0].ctxVal, evs[1].ctxVal)
		}
	})
	t.Run("Failed", func(t *testing.T) {
		fenceqtest.WaitState(t, b.db.Pool, fail, queue.StateDiscarded, 10*time.Second)
		evs := waitEvents(t, rec, fail, 2)
		if r := evs[1].res; evs[1].what != "finished" || r.Outcome != fenceq.OutcomeDiscarded || r.Err == nil || r.Err.Error() != "tax service down" {
			t.Fatalf("events %+v, want finished as discarded with the handler's error", evs)
		}
	})
	// revoke waits for the handler of job id to run, then revokes its lease as an
	// operator would, keeping the job from being claimed again.
	revoke := func(t *testing.T, id int64, q string) {
		t.Helper()
		if got := recv(t, waiting, 10*time.Second, "the handler"); got != id {
			t.Fatalf("handler of job %d runs, want %d", got, id)
		}
		if err := store.SetQueuePaused(b.ctx, b.db.Pool, q, true); err != nil {
			t.Fatal(err)
		}
		if j, err := store.RequeueJob(b.ctx, b.db.Pool, id); err != nil || j.LeaseGen != 2 {
			t.Fatalf("requeue: %+v, %v; want the lease revoked (gen 2)", j, err)
		}
	}
	t.Run("LeaseLostBeforeFinished", func(t *testing.T) {
		// The handler returns the moment the heartbeat cancels it, while the heartbeat
		// still records the lost lease: the hooks hear of the loss first all the same.
		quit := enqueue("quit")
		revoke(t, quit, "quit")
		evs := waitEvents(t, rec, quit, 3)
		if evs[0].what != "started" || evs[1].what != "lost" || evs[2].what != "finished" {
			t.Fatalf("events %+v, want started, lost, finished", evs)
		}
		if r := evs[2].res; r.Outcome != fenceq.OutcomeLeaseLost || !errors.Is(r.Err, queue.ErrLeaseLost) {
			t.Errorf("finished %+v, want lease_lost with ErrLeaseLost", r)
		}
	})
	t.Run("LeaseLostThenStaleWrite", func(t *testing.T) {
		stall := enqueue("stall")
		revoke(t, stall, "stall")
		waitEvents(t, rec, stall, 2) // started, then the heartbeat's lost
		close(release)
		evs := waitEvents(t, rec, stall, 4)
		want := []string{"started", "lost", "stale", "finished"}
		if len(evs) != len(want) {
			t.Fatalf("events %+v, want %v", evs, want)
		}
		for i, e := range evs {
			if e.what != want[i] || e.jobID != stall || e.gen != 1 {
				t.Fatalf("event %d: %+v, want %s of job %d at gen 1 (all: %+v)", i, e, want[i], stall, evs)
			}
		}
		if evs[1].alive {
			t.Errorf("lost: holderAlive for an operator's revocation")
		}
		if evs[2].op != "commit" {
			t.Errorf("stale write op %q, want commit", evs[2].op)
		}
		if r := evs[3].res; r.Outcome != fenceq.OutcomeLeaseLost || !errors.Is(r.Err, queue.ErrLeaseLost) {
			t.Errorf("finished %+v, want lease_lost with ErrLeaseLost", r)
		}
		if n := b.countEvents(t, queue.EventStaleWriteRejected, stall, 1); n != 1 {
			t.Errorf("%d stale_write_rejected events in the database, want 1", n)
		}
		for _, e := range evs[1:] {
			if e.ctxVal != fmt.Sprintf("mw of %d", stall) {
				t.Errorf("%s: context value %v, want the middleware's", e.what, e.ctxVal)
			}
		}
	})
}

// waitEvents waits until the recorder holds at least n events of the job and returns
// them.
func waitEvents(t *testing.T, rec *recorder, jobID int64, n int) []hookEvent {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs := rec.of(jobID)
		if len(evs) >= n {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d: %d hook events after 10s, want %d: %+v", jobID, len(evs), n, evs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
