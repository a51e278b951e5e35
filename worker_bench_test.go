package fenceq_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

type drainArgs struct {
	N int `json:"n"`
}

func (drainArgs) Kind() string { return "drain" }

// BenchmarkWorkerDrain works down b.N pre-inserted no-op jobs with one worker and
// reports the time and allocations per job of the whole process (worker, pgx, the
// completion batches), from Start until Stop has written the last completion: bare,
// with one no-op work middleware and one JobFinished hook, and spread over 1,000 queues
// of 1 slot each (the same 1,000 slots as the one queue). Run with a fixed count
// so that the table is the same size each time:
//
//	go test -run '^$' -bench WorkerDrain -benchtime 100000x -count 5 .
func BenchmarkWorkerDrain(b *testing.B) {
	b.Run("bare", func(b *testing.B) { benchDrain(b, fenceq.Config{}, 1) })
	b.Run("middleware+hook", func(b *testing.B) {
		benchDrain(b, fenceq.Config{
			Middleware: []fenceq.Middleware{func(ctx context.Context, _ *queue.JobRow, next func(context.Context) error) error {
				return next(ctx)
			}},
			Hooks: []fenceq.Hook{finishedCounter{}},
		}, 1)
	})
	b.Run("queues-1000", func(b *testing.B) { benchDrain(b, fenceq.Config{}, 1000) })
}

// finishedCounter is a JobFinished hook that does nothing but be called.
type finishedCounter struct{}

func (finishedCounter) JobFinished(context.Context, *queue.JobRow, fenceq.AttemptResult) {}

// benchDrain drains b.N jobs with 1,000 slots in all: one queue of 1,000, or queues
// queues of 1,000/queues each, the jobs spread over them in turn.
func benchDrain(b *testing.B, cfg fenceq.Config, queues int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	db := fenceqtest.New(b, &fenceqtest.Options{MaxConns: 8})
	items := make([]fenceq.EnqueueItem, b.N)
	for i := range items {
		items[i] = fenceq.EnqueueItem{Args: drainArgs{N: i}}
		if queues > 1 {
			items[i].Opts = &fenceq.InsertOpts{Queue: fmt.Sprintf("q%04d", i%queues)}
		}
	}
	for len(items) > 0 {
		k := min(len(items), 5000)
		if _, err := fenceq.EnqueueMany(ctx, db.Pool, items[:k]); err != nil {
			b.Fatal(err)
		}
		items = items[k:]
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE fenceq_jobs`); err != nil {
		b.Fatal(err)
	}
	var ran atomic.Int64
	all := make(chan struct{})
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(context.Context, *fenceq.Job[drainArgs]) error {
		if ran.Add(1) == int64(b.N) {
			close(all)
		}
		return nil
	}, nil)
	cfg.Handlers, cfg.Logger = hs, fenceqtest.QuietLogger()
	cfg.Queues = map[string]fenceq.QueueConfig{"default": {MaxWorkers: 1000}}
	if queues > 1 {
		cfg.Queues = make(map[string]fenceq.QueueConfig, queues)
		for i := range queues {
			cfg.Queues[fmt.Sprintf("q%04d", i)] = fenceq.QueueConfig{MaxWorkers: 1000 / queues}
		}
	}
	w, err := fenceq.NewWorker(db.Pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if err := w.Start(ctx); err != nil {
		b.Fatal(err)
	}
	<-all
	if err := w.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}
