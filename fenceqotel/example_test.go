package fenceqotel_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqotel"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/connstr"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/outbox"
)

type ReceiptArgs struct {
	Order int `json:"order"`
}

func (ReceiptArgs) Kind() string { return "receipt" }

// One trace from the application's enqueue through the job's attempt to the outbox
// delivery its Job.Commit enqueued, and that delivery's attempt.
func Example() {
	ctx := context.Background()
	pool, cleanup := exampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	exp := tracetest.NewInMemoryExporter() // an application would export to its collector
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tracing := fenceqotel.New(fenceqotel.Config{TracerProvider: tp})

	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[ReceiptArgs]) error {
		return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.Insert(ctx, tx, outbox.Message{Topic: "email", DedupeKey: fmt.Sprintf("receipt:%d", job.Args.Order)})
			return err
		})
	}, nil)
	delivered := make(chan struct{})
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Handle("email", outbox.DelivererFunc(func(ctx context.Context, d *outbox.Delivery) error {
		close(delivered)
		return nil
	})); err != nil {
		log.Fatal(err)
	}
	if err := relay.Register(hs); err != nil {
		log.Fatal(err)
	}
	cfg := fenceq.Config{Handlers: hs, Logger: slog.New(slog.DiscardHandler),
		Queues: map[string]fenceq.QueueConfig{"default": {}, outbox.Queue: {}}}
	tracing.Install(&cfg) // work middleware, insert middleware and hooks
	w, err := fenceq.NewWorker(pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}

	ctx, span := tp.Tracer("shop").Start(ctx, "checkout")
	_, err = fenceq.NewInserter(tracing.Insert).Enqueue(ctx, pool, ReceiptArgs{Order: 7}, nil)
	span.End()
	if err != nil {
		log.Fatal(err)
	}
	<-delivered
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Stop(stopCtx); err != nil { // the delivery's span ends with its completion
		log.Fatal(err)
	}

	spans := exp.GetSpans()
	sort.Slice(spans, func(i, j int) bool { return spans[i].StartTime.Before(spans[j].StartTime) })
	byID := map[string]string{}
	for _, s := range spans {
		byID[s.SpanContext.SpanID().String()] = s.Name
	}
	for _, s := range spans.Snapshots() {
		parent := byID[s.Parent().SpanID().String()]
		if parent == "" {
			parent = "-"
		}
		fmt.Printf("%-15s %-8s parent %s\n", s.Name(), s.SpanKind(), parent)
	}
	// Output:
	// checkout        internal parent -
	// send default    producer parent checkout
	// process default consumer parent send default
	// send outbox     producer parent process default
	// process outbox  consumer parent send outbox
}

func exampleSchema(ctx context.Context) (*pgxpool.Pool, func()) {
	admin, err := pgx.Connect(ctx, exampleServer())
	if err != nil {
		log.Fatal(err)
	}
	schema := fmt.Sprintf("fq_example_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, connstr.WithSearchPath(exampleServer(), schema))
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		_ = admin.Close(ctx)
	}
}

// exampleServer is the test server fenceqtest resolves; the example fails without one.
func exampleServer() string {
	u, err := fenceqtest.ServerURL()
	if err != nil {
		log.Fatal(err)
	}
	return u
}
