package fenceqtest_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

func TestWaitFor(t *testing.T) {
	t.Parallel()
	t.Run("Holds", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int64
		start := time.Now()
		fenceqtest.WaitFor(t, "the third look", 5*time.Second, func() bool { return calls.Add(1) == 3 })
		if calls.Load() != 3 {
			t.Fatalf("cond called %d times, want 3 (WaitFor returns as soon as it holds)", calls.Load())
		}
		if d := time.Since(start); d < 2*fenceqtest.PollEvery {
			t.Fatalf("three looks took %s, want at least two polls (%s)", d, 2*fenceqtest.PollEvery)
		}
	})
	t.Run("TimesOut", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		msg := mustFail(t, func(tb testing.TB) {
			fenceqtest.WaitFor(tb, "the impossible", 100*time.Millisecond, func() bool { return false })
		})
		if !strings.Contains(msg, "timed out after 100ms waiting for the impossible") {
			t.Fatalf("failure %q should say what it waited for and how long", msg)
		}
		if d := time.Since(start); d < 100*time.Millisecond {
			t.Fatalf("gave up after %s, before its 100ms", d)
		}
	})
}

// StartWorker's worker runs jobs, and is stopped (deregistered) when the test ends;
// WaitState returns the row once the job reaches the state.
func TestStartWorkerAndWaitState(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{Migrations: []migrations.Set{migrations.Core(), appMigrations()}})
	var workerID string
	t.Run("Run", func(t *testing.T) {
		w := fenceqtest.StartWorker(ctx, t, db.Pool, fenceq.Config{Handlers: greetHandlers(),
			PollInterval: 50 * time.Millisecond, Logger: fenceqtest.QuietLogger()})
		workerID = w.ID()
		res, err := fenceq.Enqueue(ctx, db.Pool, GreetArgs{Name: "ada"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		row := fenceqtest.WaitState(t, db.Pool, res.Job.ID, queue.StateCompleted, 10*time.Second)
		if row.State != queue.StateCompleted || row.LeasedBy == nil || *row.LeasedBy != workerID {
			t.Fatalf("row %+v: want completed by %s", row, workerID)
		}
		workers, err := store.ListWorkers(ctx, db.Pool)
		if err != nil || len(workers) != 1 {
			t.Fatalf("workers while running: %+v %v, want the one", workers, err)
		}
	})
	workers, err := store.ListWorkers(ctx, db.Pool)
	if err != nil || len(workers) != 0 {
		t.Fatalf("workers after the test: %+v %v, want none: StartWorker's cleanup stops it", workers, err)
	}
}

func TestWaitStateFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 2})
	res, err := fenceq.Enqueue(ctx, db.Pool, GreetArgs{Name: "nobody works me"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := mustFail(t, func(tb testing.TB) {
		fenceqtest.WaitState(tb, db.Pool, res.Job.ID, queue.StateCompleted, 100*time.Millisecond)
	})
	if !strings.Contains(msg, "is available after 100ms, want completed") {
		t.Fatalf("failure %q should give the state found and the one wanted", msg)
	}
	msg = mustFail(t, func(tb testing.TB) { fenceqtest.WaitState(tb, db.Pool, 987654, queue.StateCompleted, time.Second) })
	if !strings.Contains(msg, "job 987654") || !strings.Contains(msg, "not found") {
		t.Fatalf("failure %q should say the job does not exist", msg)
	}
	msg = mustFail(t, func(tb testing.TB) { fenceqtest.WaitState(tb, db.Pool, res.Job.ID, "done", time.Second) })
	if !strings.Contains(msg, `"done" is not a job state`) {
		t.Fatalf("failure %q should reject the state", msg)
	}
}

func TestQuietLogger(t *testing.T) {
	t.Parallel()
	log := fenceqtest.QuietLogger()
	for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		if log.Enabled(context.Background(), l) {
			t.Errorf("QuietLogger is enabled at %s, want every level discarded", l)
		}
	}
}
