package fenceq_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

type retryArgs struct {
	Mode string `json:"mode"`
}

func (retryArgs) Kind() string { return "retry_policy" }

type backoffArgs struct{}

func (backoffArgs) Kind() string { return "retry_backoff" }

// NextRetry's instant decides the retry's run_at, computed by the database from the
// row's attempted_at; a kind's own Backoff counts from the database's now() at the
// failure; JobDiscard still discards at once.
func TestNextRetryAndKindBackoffDecideRunAt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[retryArgs]) error {
		if job.Args.Mode == "discard" {
			return fenceq.JobDiscard(errors.New("permanent"))
		}
		return errors.New("try later")
	}, &fenceq.HandlerOpts{NextRetry: func(job *queue.JobRow) time.Time {
		var a retryArgs
		if err := json.Unmarshal(job.EncodedArgs, &a); err != nil {
			panic(err)
		}
		switch a.Mode {
		case "past":
			return job.AttemptedAt.Add(-time.Hour)
		}
		return job.AttemptedAt.Add(90 * time.Minute)
	}})
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[backoffArgs]) error {
		return errors.New("later")
	}, &fenceq.HandlerOpts{Backoff: &queue.Backoff{Base: 10 * time.Minute, Max: 10 * time.Minute}})
	b.startWorker(t, b.fastConfig(5*time.Second))

	enqueue := func(args fenceq.JobArgs) int64 {
		t.Helper()
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, args, &fenceq.InsertOpts{MaxAttempts: 2})
		if err != nil {
			t.Fatal(err)
		}
		return res.Job.ID
	}
	planned := enqueue(retryArgs{Mode: "plan"})
	past := enqueue(retryArgs{Mode: "past"})
	discard := enqueue(retryArgs{Mode: "discard"})
	kind := enqueue(backoffArgs{})

	j := fenceqtest.WaitState(t, b.db.Pool, planned, queue.StateRetryable, 10*time.Second)
	if want := j.AttemptedAt.Add(90 * time.Minute); !j.RunAt.Equal(want) {
		t.Fatalf("NextRetry: run_at %s, want attempted_at + 90m = %s", j.RunAt, want)
	}
	// An instant already past retries at once: run_at is the database's now() of the
	// failure, recorded with the attempt's error (and kept when the second attempt,
	// the last, discards the job).
	var failedAt, runAt time.Time
	fenceqtest.WaitState(t, b.db.Pool, past, queue.StateDiscarded, 10*time.Second)
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT (errors->0->>'at')::timestamptz, run_at FROM fenceq_jobs WHERE id = $1`, past).
		Scan(&failedAt, &runAt); err != nil {
		t.Fatal(err)
	}
	if !runAt.Equal(failedAt) {
		t.Fatalf("NextRetry in the past: run_at %s, want the failure's now() %s", runAt, failedAt)
	}
	if j := fenceqtest.WaitState(t, b.db.Pool, discard, queue.StateDiscarded, 10*time.Second); j.Attempt != 1 {
		t.Fatalf("JobDiscard with NextRetry set: attempt %d", j.Attempt)
	}
	fenceqtest.WaitState(t, b.db.Pool, kind, queue.StateRetryable, 10*time.Second)
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT (errors->0->>'at')::timestamptz, run_at FROM fenceq_jobs WHERE id = $1`, kind).
		Scan(&failedAt, &runAt); err != nil {
		t.Fatal(err)
	}
	// The kind's Backoff sets Base and Max and leaves Jitter 0: no jitter, the delay is
	// exactly Base.
	if d := runAt.Sub(failedAt); d != 10*time.Minute {
		t.Fatalf("kind Backoff without jitter: run_at - failure = %s, want exactly 10m by the database's clock", d)
	}
}
