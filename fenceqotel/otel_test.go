package fenceqotel_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqotel"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

type testBundle struct {
	db      *fenceqtest.DB
	ctx     context.Context
	exp     *tracetest.InMemoryExporter
	tp      *sdktrace.TracerProvider
	tracing *fenceqotel.Tracing
	hs      *fenceq.Handlers
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	exp := tracetest.NewInMemoryExporter()
	// A synchronous exporter: a span is exported when it ends.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &testBundle{db: fenceqtest.New(t, nil), ctx: ctx, exp: exp, tp: tp,
		tracing: fenceqotel.New(fenceqotel.Config{TracerProvider: tp}), hs: fenceq.NewHandlers()}
}

// worker starts a worker on the default and outbox queues with the tracing installed
// and then hooks, stopped when the test ends.
func (b *testBundle) worker(t *testing.T, cfg fenceq.Config, hooks ...fenceq.Hook) *fenceq.Worker {
	t.Helper()
	cfg.Handlers = b.hs
	cfg.Queues = map[string]fenceq.QueueConfig{queue.DefaultQueue: {}, outbox.Queue: {}}
	cfg.PollInterval = 50 * time.Millisecond
	cfg.Logger = fenceqtest.QuietLogger()
	b.tracing.Install(&cfg)
	cfg.Hooks = append(cfg.Hooks, hooks...)
	return fenceqtest.StartWorker(b.ctx, t, b.db.Pool, cfg)
}

// spans waits until n spans have ended and returns them by name; a name must not repeat.
func (b *testBundle) spans(t *testing.T, n int) map[string]tracetest.SpanStub {
	t.Helper()
	fenceqtest.WaitFor(t, fmt.Sprintf("%d ended spans", n), 15*time.Second, func() bool { return len(b.exp.GetSpans()) >= n })
	got := b.exp.GetSpans()
	byName := map[string]tracetest.SpanStub{}
	for _, s := range got {
		if _, dup := byName[s.Name]; dup {
			t.Fatalf("two spans named %q: %v", s.Name, names(got))
		}
		byName[s.Name] = s
	}
	if len(got) != n {
		t.Fatalf("%d spans, want %d: %v", len(got), n, names(got))
	}
	return byName
}

func names(spans tracetest.SpanStubs) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}

// attrs returns a span's attributes by key.
func attrs(kvs []attribute.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// wantSpan checks a span's kind, parent and attributes (those named in want; others
// may be present).
func wantSpan(t *testing.T, s tracetest.SpanStub, kind trace.SpanKind, parent trace.SpanContext, want map[string]any) {
	t.Helper()
	if s.SpanKind != kind {
		t.Errorf("%s: kind %s, want %s", s.Name, s.SpanKind, kind)
	}
	if s.Parent.SpanID() != parent.SpanID() || s.SpanContext.TraceID() != parent.TraceID() {
		t.Errorf("%s: parent %s in trace %s, want %s in trace %s", s.Name, s.Parent.SpanID(), s.SpanContext.TraceID(),
			parent.SpanID(), parent.TraceID())
	}
	got := attrs(s.Attributes)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %v (%T), want %v (%T)", s.Name, k, got[k], got[k], v, v)
		}
	}
}

type tracedArgs struct {
	Customer int `json:"customer"`
}

func (tracedArgs) Kind() string { return "traced" }

// One trace runs from the application's enqueue through the job's attempt, the
// delivery job that outbox.Insert enqueued in the job's Job.Commit, and that delivery
// job's attempt, down to a span the topic's Deliverer makes: checked span by span.
func TestTraceSpansEnqueueWorkAndOutboxDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[tracedArgs]) error {
		return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.Insert(ctx, tx, outbox.Message{Topic: "receipts", DedupeKey: "receipt:" + strconv.FormatInt(job.ID, 10),
				Payload: []byte(`{"customer": 7}`), JobID: job.ID})
			return err
		})
	}, nil)
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.db.Pool, Logger: fenceqtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	delivered := make(chan *outbox.Delivery, 1)
	if err := relay.Handle("receipts", outbox.DelivererFunc(func(ctx context.Context, d *outbox.Delivery) error {
		_, span := b.tp.Tracer("receiver").Start(ctx, "deliver receipt")
		span.End()
		delivered <- d
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	if err := relay.Register(b.hs); err != nil {
		t.Fatal(err)
	}
	w := b.worker(t, fenceq.Config{})

	ctx, request := b.tp.Tracer("app").Start(b.ctx, "request")
	res, err := fenceq.NewInserter(b.tracing.Insert).Enqueue(ctx, b.db.Pool, tracedArgs{Customer: 7}, nil)
	request.End()
	if err != nil {
		t.Fatal(err)
	}
	var d *outbox.Delivery
	select {
	case d = <-delivered:
	case <-time.After(15 * time.Second):
		t.Fatal("the outbox row was never delivered")
	}
	spans := b.spans(t, 6)
	if err := w.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(b.exp.GetSpans()); n != 6 {
		t.Fatalf("%d spans after the worker stopped, want 6", n)
	}
	root := spans["request"]
	if root.Parent.IsValid() {
		t.Fatalf("request span has a parent %s", root.Parent.SpanID())
	}
	job := strconv.FormatInt(res.Job.ID, 10)
	deliveryJob := strconv.FormatInt(*d.Row.DeliveryJobID, 10)
	wantSpan(t, spans["send default"], trace.SpanKindProducer, root.SpanContext, map[string]any{
		"messaging.system": "fenceq", "messaging.operation.type": "send", "messaging.destination.name": "default",
		"fenceq.job.kind": "traced", "messaging.message.id": job, "fenceq.job.existing": false,
	})
	wantSpan(t, spans["process default"], trace.SpanKindConsumer, spans["send default"].SpanContext, map[string]any{
		"messaging.system": "fenceq", "messaging.operation.type": "process", "messaging.destination.name": "default",
		"fenceq.job.kind": "traced", "messaging.message.id": job, "fenceq.job.attempt": int64(1),
		"fenceq.lease.generation": int64(1), "fenceq.job.outcome": "completed",
	})
	wantSpan(t, spans["send outbox"], trace.SpanKindProducer, spans["process default"].SpanContext, map[string]any{
		"messaging.destination.name": "outbox", "fenceq.job.kind": outbox.DeliverKind, "messaging.message.id": deliveryJob,
	})
	wantSpan(t, spans["process outbox"], trace.SpanKindConsumer, spans["send outbox"].SpanContext, map[string]any{
		"messaging.destination.name": "outbox", "fenceq.job.kind": outbox.DeliverKind, "messaging.message.id": deliveryJob,
		"fenceq.job.attempt": int64(1), "fenceq.lease.generation": int64(1), "fenceq.job.outcome": "completed",
	})
	wantSpan(t, spans["deliver receipt"], trace.SpanKindInternal, spans["process outbox"].SpanContext, nil)
	for name, s := range spans {
		if len(s.Events) != 0 || s.Status.Code != codes.Unset {
			t.Errorf("%s: events %v, status %v; want none and unset", name, s.Events, s.Status)
		}
	}
	// The attempt's span ends once its outcome is written, not when its handler returns.
	j, err := store.GetJob(b.ctx, b.db.Pool, res.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.FinishedAt == nil || spans["process default"].EndTime.Before(*j.FinishedAt) {
		t.Errorf("attempt span ended at %v, before the job's completion at %v", spans["process default"].EndTime, j.FinishedAt)
	}
	// The trace context travelled in the job's metadata.
	want := fmt.Sprintf(`{"otel": {"traceparent": "00-%s-%s-01"}}`, root.SpanContext.TraceID(), spans["send default"].SpanContext.SpanID())
	if string(j.Metadata) != want {
		t.Errorf("metadata %s, want %s", j.Metadata, want)
	}
}

type stallArgs struct{}

func (stallArgs) Kind() string { return "stall" }

// lostSignal is a hook that signals each lease a heartbeat found lost.
type lostSignal chan int64

func (s lostSignal) LeaseLost(_ context.Context, job *queue.JobRow, _ bool) { s <- job.ID }

// A lease revoked under a running attempt and the commit the fence then rejected are
// events of the attempt's span, which ends as lease_lost with an error status.
func TestAttemptSpanRecordsLostLeaseAndRejectedWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan int64, 1)
	release := make(chan struct{})
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[stallArgs]) error {
		started <- job.ID
		<-release
		return job.Commit(context.WithoutCancel(ctx), func(ctx context.Context, tx pgx.Tx) error { return nil })
	}, nil)
	lost := make(lostSignal, 1)
	b.worker(t, fenceq.Config{LeaseDuration: 5 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
		ReaperInterval: time.Minute}, lost)
	res, err := fenceq.NewInserter(b.tracing.Insert).Enqueue(b.ctx, b.db.Pool, stallArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("the job never started")
	}
	// Revoke the lease as an operator would; the paused queue keeps it from running again.
	if err := store.SetQueuePaused(b.ctx, b.db.Pool, queue.DefaultQueue, true); err != nil {
		t.Fatal(err)
	}
	if j, err := store.RequeueJob(b.ctx, b.db.Pool, id); err != nil || j.LeaseGen != 2 {
		t.Fatalf("requeue: %+v, %v; want the lease revoked (gen 2)", j, err)
	}
	select {
	case got := <-lost:
		if got != id {
			t.Fatalf("lease of job %d lost, want %d", got, id)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no heartbeat found the lease lost")
	}
	close(release)
	spans := b.spans(t, 2)
	var stale int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_lease_events WHERE job_id = $1 AND lease_gen = 1 AND kind = $2`,
		id, string(queue.EventStaleWriteRejected)).Scan(&stale); err != nil || stale != 1 {
		t.Fatalf("%d stale_write_rejected events (%v), want the rejected commit's", stale, err)
	}
	s := spans["process default"]
	wantSpan(t, s, trace.SpanKindConsumer, spans["send default"].SpanContext, map[string]any{
		"fenceq.job.kind": "stall", "fenceq.lease.generation": int64(1), "fenceq.job.outcome": "lease_lost",
	})
	if s.Status.Code != codes.Error || !strings.Contains(s.Status.Description, queue.ErrLeaseLost.Error()) {
		t.Errorf("status %+v, want an error saying the lease was lost", s.Status)
	}
	if len(s.Events) != 2 {
		t.Fatalf("events %+v, want the lost lease and the rejected write", s.Events)
	}
	if e := s.Events[0]; e.Name != fenceqotel.EventLeaseLost ||
		fmt.Sprint(attrs(e.Attributes)) != fmt.Sprint(map[string]any{"fenceq.lease.generation": int64(1), "fenceq.lease.holder_alive": false}) {
		t.Errorf("event 0: %s %v, want %s at generation 1, holder not alive", e.Name, attrs(e.Attributes), fenceqotel.EventLeaseLost)
	}
	if e := s.Events[1]; e.Name != fenceqotel.EventStaleWriteRejected ||
		fmt.Sprint(attrs(e.Attributes)) != fmt.Sprint(map[string]any{"fenceq.lease.generation": int64(1), "fenceq.write.op": "commit"}) {
		t.Errorf("event 1: %s %v, want %s of the commit at generation 1", e.Name, attrs(e.Attributes), fenceqotel.EventStaleWriteRejected)
	}
}

// A COPY batch is one producer span, whose context every job of the batch carries.
func TestBatchEnqueueIsOneProducerSpan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	items := []fenceq.EnqueueItem{{Args: tracedArgs{Customer: 1}}, {Args: tracedArgs{Customer: 2}}, {Args: stallArgs{}}}
	n, err := fenceq.NewInserter(b.tracing.Insert).EnqueueMany(b.ctx, b.db.Pool, items)
	if err != nil || n != 3 {
		t.Fatalf("enqueue many: %d, %v", n, err)
	}
	spans := b.exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("spans %v, want one", names(spans))
	}
	s := spans[0]
	got := attrs(s.Attributes)
	if s.Name != "send default" || s.SpanKind != trace.SpanKindProducer || got["messaging.batch.message_count"] != int64(3) ||
		got["messaging.destination.name"] != "default" || got["fenceq.job.kind"] != nil {
		t.Fatalf("span %s (%s) %v: want send default, one destination, two kinds so no kind", s.Name, s.SpanKind, got)
	}
	want := fmt.Sprintf("00-%s-%s-01", s.SpanContext.TraceID(), s.SpanContext.SpanID())
	var carried int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs WHERE metadata->'otel'->>'traceparent' = $1`, want).Scan(&carried); err != nil || carried != 3 {
		t.Fatalf("%d jobs carry traceparent %s (%v), want 3", carried, want, err)
	}
}
