package fenceq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

type failArgs struct{}

func (failArgs) Kind() string { return "always.fails" }

// A running worker keeps the job counters: the jobs it completed and discarded show in
// CountJobs and CountErrorsByKind without anyone else rolling up.
func TestWorkerRollsUpJobCounters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(context.Context, *fenceq.Job[echoArgs]) error { return nil }, nil)
	fenceq.AddHandler(b.hs, func(context.Context, *fenceq.Job[failArgs]) error { return errors.New("no") }, nil)
	b.startWorker(t, b.fastConfig(2*time.Second))
	var last int64
	for range 3 {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{Value: "x"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		last = res.Job.ID
	}
	bad, err := fenceq.Enqueue(b.ctx, b.db.Pool, failArgs{}, &fenceq.InsertOpts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitState(t, b.db.Pool, last, queue.StateCompleted, 20*time.Second)
	fenceqtest.WaitState(t, b.db.Pool, bad.Job.ID, queue.StateDiscarded, 20*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := fenceq.CountJobs(b.ctx, b.db.Pool, queue.CountParams{})
		if err != nil {
			t.Fatal(err)
		}
		var completed, discarded int64
		for _, q := range c.Queues {
			completed += q.Finished[queue.StateCompleted]
			discarded += q.Finished[queue.StateDiscarded]
		}
		if completed == 3 && discarded == 1 {
			break
		}
		if completed > 3 || discarded > 1 || time.Now().After(deadline) {
			st, _ := fenceq.JobCountersState(b.ctx, b.db.Pool)
			t.Fatalf("counted %d completed, %d discarded, want 3 and 1 (counters %+v)", completed, discarded, st)
		}
		time.Sleep(fenceqtest.PollEvery)
	}
	ek, err := fenceq.CountErrorsByKind(b.ctx, b.db.Pool, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(ek) != 1 || ek[0] != (queue.KindErrors{Kind: "always.fails", Discarded: 1, Failed: 1}) {
		t.Fatalf("errors by kind: %+v", ek)
	}
}
