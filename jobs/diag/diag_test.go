package diag_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/queue"
)

func TestValidateSleep(t *testing.T) {
	t.Parallel()
	for args, ok := range map[string]bool{
		`{"duration": "5s"}`: true, `{"duration": "0s"}`: true, `{}`: true,
		`{"duration": 5}`: false, `{"duration": "soon"}`: false, `{"duration": "-1s"}`: false, `{"duration": "48h"}`: false,
	} {
		if err := diag.ValidateSleep([]byte(args)); (err == nil) != ok {
			t.Errorf("ValidateSleep(%s) = %v, want ok=%v", args, err, ok)
		}
	}
}

// TestSleepAndNoop runs both kinds on a real worker: noop completes; a long sleep
// returns as soon as its context is cancelled (the worker stops), and its lease is given
// back instead of the job being completed.
func TestSleepAndNoop(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	hs := fenceq.NewHandlers()
	diag.Register(hs)
	w, err := fenceq.NewWorker(db.Pool, fenceq.Config{Handlers: hs, PollInterval: 50 * time.Millisecond,
		ShutdownGrace: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	noop, err := fenceq.Enqueue(ctx, db.Pool, diag.NoopArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sleep, err := fenceq.Enqueue(ctx, db.Pool, diag.SleepArgs{Duration: diag.Duration(time.Hour)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(sleep.Job.EncodedArgs) != `{"duration": "1h0m0s"}` {
		t.Errorf("sleep args stored as %s", sleep.Job.EncodedArgs)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitState(t, db.Pool, noop.Job.ID, queue.StateCompleted, 10*time.Second)
	fenceqtest.WaitState(t, db.Pool, sleep.Job.ID, queue.StateRunning, 10*time.Second)
	stopCtx, cancelStop := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelStop()
	start := time.Now()
	if err := w.Stop(stopCtx); err != nil {
		t.Fatalf("stop: %v (the sleep handler did not return on cancellation)", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stop took %s", d)
	}
	j, err := store.GetJob(ctx, db.Pool, sleep.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != queue.StateAvailable {
		t.Fatalf("interrupted sleep job is %s, want available (lease released)", j.State)
	}
}

// TestSleepIgnoringCancel revokes the lease of a sleep job that ignores cancellation
// while it sleeps: the handler sleeps on and reports success, and the fence rejects its
// late completion; the job runs again and completes under a new lease.
func TestSleepIgnoringCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	hs := fenceq.NewHandlers()
	diag.Register(hs)
	w, err := fenceq.NewWorker(db.Pool, fenceq.Config{Handlers: hs, PollInterval: 50 * time.Millisecond,
		LeaseDuration: 2 * time.Second, HeartbeatInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	res, err := fenceq.Enqueue(ctx, db.Pool, diag.SleepArgs{Duration: diag.Duration(time.Second), IgnoreCancel: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	waitFor := func(what string, cond func(j *queue.JobRow) bool) *queue.JobRow {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			j, err := store.GetJob(ctx, db.Pool, id)
			if err != nil {
				t.Fatal(err)
			}
			if cond(j) {
				return j
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %d: %s: still %s, attempt %d", id, what, j.State, j.Attempt)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	first := waitFor("claimed", func(j *queue.JobRow) bool { return j.State == queue.StateRunning })
	// Revoked while its handler sleeps: the heartbeat cancels its context, which it
	// ignores.
	if _, err := store.RequeueJob(ctx, db.Pool, id); err != nil {
		t.Fatal(err)
	}
	done := waitFor("completed", func(j *queue.JobRow) bool { return j.State == queue.StateCompleted })
	if done.Attempt < 2 {
		t.Fatalf("completed on attempt %d; the revoked first attempt's completion must have been rejected", done.Attempt)
	}
	events, err := store.ListLeaseEvents(ctx, db.Pool, id, 20)
	if err != nil {
		t.Fatal(err)
	}
	stale := false
	for _, e := range events {
		if e.LeaseGen == first.LeaseGen && (e.Kind == queue.EventStaleWriteRejected || e.Kind == queue.EventHeartbeatLost) {
			stale = true
		}
	}
	if !stale {
		t.Fatalf("no rejected write or lost heartbeat recorded for the revoked lease (gen %d): %+v", first.LeaseGen, events)
	}
}
