package fenceq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// runUntil starts a worker with cfg in a schema of its own, runs enqueue, waits for
// done and stops the worker (which writes the last completions before it returns),
// then runs after, if not nil.
func runUntil(ctx context.Context, cfg fenceq.Config, done <-chan struct{}, enqueue func(*pgxpool.Pool) error, after func(*pgxpool.Pool)) {
	pool, cleanup := exampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	w, err := fenceq.NewWorker(pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	if err := enqueue(pool); err != nil {
		log.Fatal(err)
	}
	<-done
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	if after != nil {
		after(pool)
	}
}

// Middleware wraps every attempt: worker-level middleware (Config.Middleware) runs
// outside the kind's own (HandlerOpts.Middleware). Insert middleware wraps enqueues:
// an Inserter applies it to the application's, and the worker's Config.InsertMiddleware
// to those its handlers make. Here it stamps a tenant into each job's metadata, which
// work middleware reads back.
func ExampleMiddleware() {
	ctx := context.Background()
	stampTenant := func(ctx context.Context, jobs []*fenceq.InsertJob, next func(context.Context) error) error {
		for _, j := range jobs {
			j.Opts.Metadata["tenant"] = "acme"
		}
		return next(ctx)
	}
	logAttempt := func(ctx context.Context, job *queue.JobRow, next func(context.Context) error) error {
		var meta struct {
			Tenant string `json:"tenant"`
		}
		if err := json.Unmarshal(job.Metadata, &meta); err != nil {
			return err
		}
		fmt.Printf("worker middleware: %s attempt %d for tenant %s\n", job.Kind, job.Attempt, meta.Tenant)
		err := next(ctx)
		fmt.Println("worker middleware: handler returned", err)
		return err
	}
	kindOnly := func(ctx context.Context, job *queue.JobRow, next func(context.Context) error) error {
		fmt.Println("greet middleware")
		return next(ctx)
	}

	done := make(chan struct{})
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		defer close(done)
		fmt.Println("handler: hello,", job.Args.Name)
		return nil
	}, &fenceq.HandlerOpts{Middleware: []fenceq.Middleware{kindOnly}})

	ins := fenceq.NewInserter(stampTenant) // for the application's own enqueues
	cfg := fenceq.Config{Handlers: hs, Middleware: []fenceq.Middleware{logAttempt},
		InsertMiddleware: []fenceq.InsertMiddleware{stampTenant}} // for its handlers' enqueues
	runUntil(ctx, cfg, done, func(pool *pgxpool.Pool) error {
		_, err := ins.Enqueue(ctx, pool, GreetArgs{Name: "world"}, nil)
		return err
	}, nil)
	// Output:
	// worker middleware: greet attempt 1 for tenant acme
	// greet middleware
	// handler: hello, world
	// worker middleware: handler returned <nil>
}

// RecordOutput stores a handler's result with the job's completion; `fenceq jobs show`
// and JobRow.Output return it.
func ExampleRecordOutput() {
	ctx := context.Background()
	done := make(chan struct{})
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		defer close(done)
		// Written by the job's fenced completion, or not at all (a failed attempt, a
		// lost lease). Inside job.Commit's function it joins that transaction.
		return fenceq.RecordOutput(ctx, map[string]string{"greeting": "hello, " + job.Args.Name})
	}, nil)
	var id int64
	runUntil(ctx, fenceq.Config{Handlers: hs}, done, func(pool *pgxpool.Pool) error {
		res, err := fenceq.Enqueue(ctx, pool, GreetArgs{Name: "world"}, nil)
		if err == nil {
			id = res.Job.ID
		}
		return err
	}, func(pool *pgxpool.Pool) {
		job, err := store.GetJob(ctx, pool, id)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(job.State, string(job.Output))
	})
	// Output: completed {"greeting": "hello, world"}
}

// A hook observes the worker's lifecycle events; a value implements any of the hook
// interfaces it needs. Prometheus metrics (internal/metrics) and OpenTelemetry
// (fenceqotel) are hooks too.
func ExampleHook() {
	ctx := context.Background()
	done := make(chan struct{})
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		if job.Attempt == 1 {
			return fmt.Errorf("greeting service unavailable")
		}
		return nil
	}, &fenceq.HandlerOpts{Backoff: &queue.Backoff{Base: time.Millisecond, Max: time.Millisecond}})
	hook := outcomePrinter{done: done}
	cfg := fenceq.Config{Handlers: hs, Hooks: []fenceq.Hook{hook}, ReaperInterval: 50 * time.Millisecond}
	runUntil(ctx, cfg, done, func(pool *pgxpool.Pool) error {
		_, err := fenceq.Enqueue(ctx, pool, GreetArgs{Name: "world"}, nil)
		return err
	}, nil)
	// Output:
	// greet attempt 1 started at lease generation 1
	// greet attempt 1: retried (greeting service unavailable)
	// greet attempt 2 started at lease generation 2
	// greet attempt 2: completed (<nil>)
}

// outcomePrinter prints each attempt's start and outcome.
type outcomePrinter struct{ done chan struct{} }

func (p outcomePrinter) JobStarted(_ context.Context, job *queue.JobRow) {
	fmt.Printf("%s attempt %d started at lease generation %d\n", job.Kind, job.Attempt, job.LeaseGen)
}

func (p outcomePrinter) JobFinished(_ context.Context, job *queue.JobRow, res fenceq.AttemptResult) {
	fmt.Printf("%s attempt %d: %s (%v)\n", job.Kind, job.Attempt, res.Outcome, res.Err)
	if res.Outcome == fenceq.OutcomeCompleted {
		close(p.done)
	}
}
