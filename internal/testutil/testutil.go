// Package testutil holds the helpers that the test suites of several packages share:
// a logger that discards, a polling wait for a condition, and starting a worker that
// is stopped when the test ends. Test databases come from internal/dbtest.
package testutil

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
)

// PollEvery is how often WaitFor checks its condition.
const PollEvery = 20 * time.Millisecond

// QuietLogger returns a logger that discards every record, for workers in tests.
func QuietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// WaitFor polls cond every PollEvery until it holds, and fails the test if it still
// does not hold after within; what names the condition in the failure.
func WaitFor(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(PollEvery)
	}
}

// StartWorker creates a worker on pool with cfg and starts it under ctx, failing the
// test on error. The worker is stopped (gracefully, within 10 s) when the test ends; a
// failed stop fails the test.
func StartWorker(ctx context.Context, t testing.TB, pool *pgxpool.Pool, cfg fenceq.Config) *fenceq.Worker {
	t.Helper()
	w, err := fenceq.NewWorker(pool, cfg)
	if err != nil {
		t.Fatalf("new worker %s: %v", cfg.ID, err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatalf("start worker %s: %v", cfg.ID, err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.Stop(stopCtx); err != nil {
			t.Errorf("stop worker %s: %v", cfg.ID, err)
		}
	})
	return w
}
