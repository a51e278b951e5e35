package fenceq_test

import (
	"context"
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
// and with one no-op work middleware and one JobFinished hook. Run with a fixed count
// so that the table is the same size each time:
//
//	go test -run '^$' -bench WorkerDrain -benchtime 100000x -count 5 .
func BenchmarkWorkerDrain(b *testing.B) {
	b.Run("bare", func(b *testing.B) { benchDrain(b, fenceq.Config{}) })
	b.Run("middleware+hook", func(b *testing.B) {
		benchDrain(b, fenceq.Config{
			Middleware: []fenceq.Middleware{func(ctx context.Context, _ *queue.JobRow, next func(context.Context) error) error {
				return next(ctx)
			}},
			Hooks: []fenceq.Hook{finishedCounter{}},
		})
	})
}

// finishedCounter is a JobFinished hook that does nothing but be called.
type finishedCounter struct{}

func (finishedCounter) JobFinished(context.Context, *queue.JobRow, fenceq.AttemptResult) {}

func benchDrain(b *testing.B, cfg fenceq.Config) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	db := fenceqtest.New(b, &fenceqtest.Options{MaxConns: 8})
	items := make([]fenceq.EnqueueItem, b.N)
	for i := range items {
		items[i] = fenceq.EnqueueItem{Args: drainArgs{N: i}}
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
