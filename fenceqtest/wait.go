package fenceqtest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// PollEvery is how often WaitFor and WaitState check their condition.
const PollEvery = 20 * time.Millisecond

// WaitFor checks cond every PollEvery until it holds, and fails the test if it still
// does not after within; what names the condition in the failure ("the job to run
// twice").
func WaitFor(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("fenceqtest: timed out after %s waiting for %s", within, what)
		}
		time.Sleep(PollEvery)
	}
}

// WaitState waits until the job is in state want, reading it through db every
// PollEvery, and returns its row then. It fails the test when the job cannot be read,
// or is still in another state after within; the failure says which, with the job's
// attempt errors.
func WaitState(t testing.TB, db queue.DBTX, jobID int64, want queue.State, within time.Duration) *queue.JobRow {
	t.Helper()
	if !want.Valid() {
		t.Fatalf("fenceqtest: WaitState: %q is not a job state (want one of %v)", want, queue.JobStates())
	}
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		j, err := fenceq.GetJob(ctx, db, jobID)
		cancel()
		if err != nil {
			t.Fatalf("fenceqtest: WaitState: %v", err)
		}
		if j.State == want {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("fenceqtest: job %d (%s) is %s after %s, want %s (attempt %d, errors %s)",
				jobID, j.Kind, j.State, within, want, j.Attempt, attemptErrors(j))
		}
		time.Sleep(PollEvery)
	}
}

// attemptErrors renders a job's attempt errors for a failure message.
func attemptErrors(j *queue.JobRow) string {
	if len(j.Errors) == 0 {
		return "none"
	}
	parts := make([]string, len(j.Errors))
	for i, e := range j.Errors {
		parts[i] = fmt.Sprintf("attempt %d: %s", e.Attempt, e.Error)
	}
	return strings.Join(parts, "; ")
}

// QuietLogger returns a logger that discards every record, for workers in tests.
func QuietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// StartWorker creates a worker on pool with cfg and starts it under ctx, failing the
// test on error. The worker is stopped gracefully (within 10s) when the test ends; a
// failed stop fails the test.
func StartWorker(ctx context.Context, t testing.TB, pool *pgxpool.Pool, cfg fenceq.Config) *fenceq.Worker {
	t.Helper()
	w, err := fenceq.NewWorker(pool, cfg)
	if err != nil {
		t.Fatalf("fenceqtest: new worker: %v", err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatalf("fenceqtest: start worker %s: %v", w.ID(), err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.Stop(stopCtx); err != nil {
			t.Errorf("fenceqtest: stop worker %s: %v", w.ID(), err)
		}
	})
	return w
}
