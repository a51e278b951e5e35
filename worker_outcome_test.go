package fenceq_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

type stepArgs struct {
	Mode string `json:"mode"`
}

func (stepArgs) Kind() string { return "step" }

// Handler outcomes: nil completes, an error retries with backoff and discards after max
// attempts, a panic is a failure with its stack recorded (and the worker keeps going),
// JobSnooze, JobCancel and JobDiscard steer the job, a per-kind timeout cancels the
// context with ErrJobTimeout.
func TestHandlerOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var flaky atomic.Int64
	var snoozed atomic.Int64
	timeoutCause := make(chan error, 1)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[stepArgs]) error {
		switch job.Args.Mode {
		case "ok":
			return nil
		case "flaky": // fails twice, then succeeds
			if flaky.Add(1) <= 2 {
				return errors.New("tax service unavailable")
			}
			return nil
		case "always":
			return errors.New("always broken")
		case "panic":
			panic("nil map somewhere")
		case "snooze":
			if snoozed.Add(1) == 1 {
				return fenceq.JobSnooze(50 * time.Millisecond)
			}
			return nil
		case "cancel":
			return fenceq.JobCancel(errors.New("customer closed the account"))
		case "discard":
			return fenceq.JobDiscard(errors.New("malformed invoice template"))
		case "slow":
			<-ctx.Done()
			timeoutCause <- context.Cause(ctx)
			return ctx.Err()
		}
		return errors.New("unknown mode")
	}, &fenceq.HandlerOpts{Timeout: 2 * time.Second, Backoff: &queue.Backoff{Base: 10 * time.Millisecond, Max: 20 * time.Millisecond}})
	cfg := b.fastConfig(5 * time.Second)
	cfg.ReaperInterval = 50 * time.Millisecond
	b.startWorker(t, cfg)

	enqueue := func(mode string, maxAttempts int) int64 {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, stepArgs{Mode: mode}, &fenceq.InsertOpts{MaxAttempts: maxAttempts})
		if err != nil {
			t.Fatal(err)
		}
		return res.Job.ID
	}
	ids := map[string]int64{}
	for _, m := range []string{"ok", "flaky", "always", "panic", "snooze", "cancel", "discard", "slow"} {
		ids[m] = enqueue(m, 3)
	}

	t.Run("Completed", func(t *testing.T) {
		j := fenceqtest.WaitState(t, b.db.Pool, ids["ok"], queue.StateCompleted, 10*time.Second)
		if j.Attempt != 1 || len(j.Errors) != 0 {
			t.Fatalf("%+v", j)
		}
	})
	t.Run("RetriedWithBackoffThenCompleted", func(t *testing.T) {
		j := fenceqtest.WaitState(t, b.db.Pool, ids["flaky"], queue.StateCompleted, 10*time.Second)
		if j.Attempt != 3 || len(j.Errors) != 2 || j.Errors[0].Error != "tax service unavailable" {
			t.Fatalf("attempt %d errors %+v", j.Attempt, j.Errors)
		}
	})
	t.Run("DiscardedAfterMaxAttempts", func(t *testing.T) {
		j := fenceqtest.WaitState(t, b.db.Pool, ids["always"], queue.StateDiscarded, 10*time.Second)
		if j.Attempt != 3 || len(j.Errors) != 3 || j.FinishedAt == nil {
			t.Fatalf("attempt %d errors %d", j.Attempt, len(j.Errors))
		}
	})
	t.Run("PanicRecordedWithStack", func(t *testing.T) {
		j := fenceqtest.WaitState(t, b.db.Pool, ids["panic"], queue.StateDiscarded, 10*time.Second)
		last := j.Errors[len(j.Errors)-1]
		if !strings.Contains(last.Error, "nil map somewhere") || !strings.Contains(last.Trace, "goroutine") {
			t.Fatalf("panic error %q trace %q", last.Error, last.Trace)
		}
	})
	t.Run("Snoozed", func(t *testing.T) {
		j := fenceqtest.WaitState(t, b.db.Pool, ids["snooze"], queue.StateCompleted, 10*time.Second)
		if j.Attempt != 2 || j.MaxAttempts != 4 || len(j.Errors) != 0 {
			t.Fatalf("attempt %d max %d errors %d: a snooze is not a failure", j.Attempt, j.MaxAttempts, len(j.Errors))
		}
	})
	t.Run("Cancelled", func(t *testing.T) {
		j := fenceqtest.WaitState(t, b.db.Pool, ids["cancel"], queue.StateCancelled, 10*time.Second)
		if j.Attempt != 1 || !strings.Contains(j.Errors[0].Error, "closed the account") {
			t.Fatalf("%+v", j.Errors)
		}
	})
	t.Run("DiscardedAtOnce", func(t *testing.T) {
		j := fenceqtest.WaitState(t, b.db.Pool, ids["discard"], queue.StateDiscarded, 10*time.Second)
		if j.Attempt != 1 {
			t.Fatalf("attempt %d, want 1", j.Attempt)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		select {
		case cause := <-timeoutCause:
			if !errors.Is(cause, fenceq.ErrJobTimeout) {
				t.Fatalf("cause %v", cause)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("slow job never timed out")
		}
		j := fenceqtest.WaitState(t, b.db.Pool, ids["slow"], queue.StateRetryable, 10*time.Second)
		if !strings.Contains(j.Errors[0].Error, "job timeout") {
			t.Fatalf("error %q", j.Errors[0].Error)
		}
	})
}

type undecodableArgs struct {
	N int `json:"n"`
}

func (undecodableArgs) Kind() string { return "undecodable" }

func TestArgsThatDoNotDecodeAreDiscarded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[undecodableArgs]) error { return nil }, nil)
	b.startWorker(t, b.fastConfig(5*time.Second))
	res, err := store.Insert(b.ctx, b.db.Pool, store.InsertParams{Kind: "undecodable", Args: []byte(`{"n":"not a number"}`)})
	if err != nil {
		t.Fatal(err)
	}
	j := fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateDiscarded, 10*time.Second)
	if j.Attempt != 1 || !strings.Contains(j.Errors[0].Error, "decode undecodable args") {
		t.Fatalf("%+v", j.Errors)
	}
}

// LISTEN/NOTIFY: with polling set to a minute, an insert still wakes the worker.
func TestInsertWakesWorkerWithoutPolling(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil }, nil)
	cfg := b.fastConfig(5 * time.Second)
	cfg.PollInterval = time.Minute
	b.startWorker(t, cfg)
	// The listener is connected once its LISTEN is the last statement of a backend.
	listen := `LISTEN "` + store.ChannelPrefix + b.db.Schema + `"`
	fenceqtest.WaitFor(t, "the worker's LISTEN", 10*time.Second, func() bool {
		var n int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = $1`, listen).Scan(&n); err != nil {
			t.Fatalf("read pg_stat_activity: %v", err)
		}
		return n > 0
	})
	// A wake-up on connect polls once; the first job may ride on it, the second cannot:
	// with polling a minute apart, only a notification finds it within seconds.
	for _, v := range []string{"wake-1", "wake-2"} {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{Value: v}, nil)
		if err != nil {
			t.Fatal(err)
		}
		fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, 10*time.Second)
	}
}

func TestPausedQueueIsNotWorkedUntilResumed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil }, nil)
	if err := store.SetQueuePaused(b.ctx, b.db.Pool, "default", true); err != nil {
		t.Fatal(err)
	}
	tr := &claimsInFlight{}
	fenceqtest.StartWorker(b.ctx, t, b.tracedPool(t, tr, 4), b.fastConfig(5*time.Second))
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The worker has looked for the job: two claims that started after the insert
	// committed have ended (more have ended than had started by then).
	_, startedBefore, _ := tr.read()
	fenceqtest.WaitFor(t, "two claims after the insert", 30*time.Second, func() bool {
		return tr.ended() >= startedBefore+2
	})
	if _, _, withRows := tr.read(); withRows != 0 {
		t.Fatalf("%d claims on the paused queue returned a job", withRows)
	}
	j, err := store.GetJob(b.ctx, b.db.Pool, res.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != queue.StateAvailable {
		t.Fatalf("paused queue's job is %s", j.State)
	}
	if err := store.SetQueuePaused(b.ctx, b.db.Pool, "default", false); err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, 10*time.Second)
}

// The worker never runs more jobs of a queue at once than its MaxWorkers.
func TestConcurrencyIsBoundedBySlots(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var now, peak atomic.Int64
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error {
		n := now.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		now.Add(-1)
		return nil
	}, nil)
	cfg := b.fastConfig(5 * time.Second)
	cfg.Queues = map[string]fenceq.QueueConfig{"default": {MaxWorkers: 3}}
	b.startWorker(t, cfg)
	items := make([]fenceq.EnqueueItem, 60)
	for i := range items {
		items[i] = fenceq.EnqueueItem{Args: echoArgs{}}
	}
	if _, err := fenceq.EnqueueMany(b.ctx, b.db.Pool, items); err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitFor(t, "all 60 jobs completed", 30*time.Second, func() bool {
		var n int
		_ = b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs WHERE state = 'completed'`).Scan(&n)
		return n == 60
	})
	if p := peak.Load(); p > 3 || p < 2 {
		t.Fatalf("peak concurrency %d, want at most 3 (and more than 1)", p)
	}
}

func TestConfigValidationNamesTheField(t *testing.T) {
	t.Parallel()
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil }, nil)
	b := setup(t)
	cases := map[string]fenceq.Config{
		"Handlers":            {},
		"Queues":              {Handlers: hs, Queues: map[string]fenceq.QueueConfig{"bad queue": {}}},
		"HeartbeatInterval":   {Handlers: hs, LeaseDuration: time.Second, HeartbeatInterval: 2 * time.Second},
		"LeaseMargin":         {Handlers: hs, LeaseDuration: time.Second, HeartbeatInterval: 500 * time.Millisecond, LeaseMargin: 600 * time.Millisecond},
		"MaxWorkers":          {Handlers: hs, Queues: map[string]fenceq.QueueConfig{"q": {MaxWorkers: -1}}},
		"LeaseEventRetention": {Handlers: hs, LeaseEventRetention: -time.Hour},
		"StaleWorkerAge":      {Handlers: hs, StaleWorkerAge: -time.Hour},
		"Backoff.Jitter":      {Handlers: hs, Backoff: queue.Backoff{Base: time.Second, Jitter: 2}},
		"Backoff.Base":        {Handlers: hs, Backoff: queue.Backoff{Base: -time.Second}},
	}
	for field, cfg := range cases {
		if _, err := fenceq.NewWorker(b.db.Pool, cfg); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err = %v, want it named", field, err)
		}
	}
	if err := fenceq.AddHandlerSafely(hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil }, nil); err == nil {
		t.Error("registering a kind twice must fail")
	}
	err := fenceq.AddHandlerSafely(fenceq.NewHandlers(), func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil },
		&fenceq.HandlerOpts{Backoff: &queue.Backoff{Jitter: -0.5}})
	if err == nil || !strings.Contains(err.Error(), "HandlerOpts.Backoff.Jitter") {
		t.Errorf("HandlerOpts.Backoff with Jitter -0.5: err = %v, want the field named", err)
	}
}
