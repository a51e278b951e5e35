// Package fenceqotel traces fenceq jobs with OpenTelemetry: a producer span for each
// enqueue, a consumer span for each attempt of a job. The trace context travels in the
// job's metadata (the W3C traceparent, through the configured propagator), so that one
// trace runs from an enqueue through the job's work to the jobs that work enqueues in
// turn — such as the outbox delivery job that outbox.Insert enqueues in Job.Commit —
// and through their work.
//
// # Use
//
//	tracing := fenceqotel.New(fenceqotel.Config{TracerProvider: tp})
//	cfg := fenceq.Config{Handlers: hs}
//	tracing.Install(&cfg)                    // Middleware, InsertMiddleware and Hooks
//	w, err := fenceq.NewWorker(pool, cfg)
//	…
//	ins := fenceq.NewInserter(tracing.Insert) // the application's own enqueues
//	ins.Enqueue(ctx, pool, args, nil)        // a child of ctx's span
//
// # Spans
//
// An enqueue's span is named "send QUEUE", of kind producer; an EnqueueMany batch is
// one span for the whole batch (messaging.batch.message_count), whose context every job
// of the batch carries. An attempt's span is named "process QUEUE", of kind consumer, a
// child of the span of the enqueue that wrote the job; it starts when the attempt's
// middleware runs and ends when the attempt's outcome is settled (its completion
// written, or its lease known lost), with fenceq.job.outcome set and an error status
// for any outcome but completed, snoozed and released. A lease a heartbeat found
// revoked and a write the fence rejected are span events of the attempt
// (EventLeaseLost, EventStaleWriteRejected).
//
// Attributes follow the messaging semantic conventions: messaging.system (fenceq),
// messaging.operation.type (send, process), messaging.operation.name (enqueue, work),
// messaging.destination.name (the queue), messaging.message.id (the job id), and
// fenceq's own: fenceq.job.kind, fenceq.job.attempt, fenceq.lease.generation,
// fenceq.job.outcome.
package fenceqotel

import (
	"context"
	"encoding/json"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/fenceq/fenceq/fenceqotel"

// MetadataKey is the key of the job metadata that carries the trace context: an object
// of the propagator's fields, such as {"traceparent": "00-…-…-01"}.
const MetadataKey = "otel"

// System is the value of messaging.system.
const System = "fenceq"

// Attributes of fenceq's own, beside the messaging semantic conventions.
const (
	AttrJobKind     = attribute.Key("fenceq.job.kind")
	AttrJobAttempt  = attribute.Key("fenceq.job.attempt")
	AttrLeaseGen    = attribute.Key("fenceq.lease.generation")
	AttrJobOutcome  = attribute.Key("fenceq.job.outcome")
	AttrJobExisting = attribute.Key("fenceq.job.existing") // the unique key matched an unfinished job
	AttrWriteOp     = attribute.Key("fenceq.write.op")     // the write the fence rejected
	AttrHolderAlive = attribute.Key("fenceq.lease.holder_alive")
)

// Span events of an attempt.
const (
	// EventLeaseLost: a heartbeat found the attempt's lease revoked; the job's context
	// was cancelled.
	EventLeaseLost = "fenceq.lease.lost"
	// EventStaleWriteRejected: the database rejected a write of the attempt, its lease
	// generation having moved on.
	EventStaleWriteRejected = "fenceq.stale_write.rejected"
)

// Config configures Tracing.
type Config struct {
	// TracerProvider makes the tracer. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator writes and reads the trace context in job metadata. Defaults to
	// propagation.TraceContext{} (W3C traceparent and tracestate).
	Propagator propagation.TextMapPropagator
}

// Tracing makes the spans: its Insert is fenceq insert middleware, its Work fenceq
// work middleware, and it is a fenceq hook (JobFinished, LeaseLost,
// StaleWriteRejected) that ends and annotates the attempt spans. Register all three,
// with Install or by hand. It is safe for concurrent use.
type Tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

var (
	_ fenceq.JobFinishedHook        = (*Tracing)(nil)
	_ fenceq.LeaseLostHook          = (*Tracing)(nil)
	_ fenceq.StaleWriteRejectedHook = (*Tracing)(nil)
)

// New returns a Tracing with cfg's defaults applied.
func New(cfg Config) *Tracing {
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	return &Tracing{tracer: cfg.TracerProvider.Tracer(ScopeName), prop: cfg.Propagator}
}

// Install adds the tracing to a worker's config: Work as the outermost middleware (so
// that the attempt's span covers the other middleware), Insert as the outermost insert
// middleware, and t as a hook after the others.
func (t *Tracing) Install(cfg *fenceq.Config) {
	cfg.Middleware = append([]fenceq.Middleware{t.Work}, cfg.Middleware...)
	cfg.InsertMiddleware = append([]fenceq.InsertMiddleware{t.Insert}, cfg.InsertMiddleware...)
	cfg.Hooks = append(cfg.Hooks, t)
}

var systemAttr = semconv.MessagingSystemKey.String(System)

// Insert is insert middleware: it makes the enqueue's producer span, a child of ctx's
// span, and writes the span's context into the metadata of every job it enqueues.
func (t *Tracing) Insert(ctx context.Context, jobs []*fenceq.InsertJob, next func(context.Context) error) error {
	attrs := []attribute.KeyValue{systemAttr, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("enqueue")}
	name := "send"
	if q, ok := common(jobs, func(j *fenceq.InsertJob) string { return j.Opts.Queue }); ok {
		attrs = append(attrs, semconv.MessagingDestinationName(q))
		name += " " + q
	}
	if k, ok := common(jobs, func(j *fenceq.InsertJob) string { return j.Kind }); ok {
		attrs = append(attrs, AttrJobKind.String(k))
	}
	if len(jobs) != 1 {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(len(jobs)))
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	defer span.End()
	carrier := propagation.MapCarrier{}
	t.prop.Inject(ctx, carrier)
	if len(carrier) > 0 {
		for _, j := range jobs {
			if j.Opts.Metadata == nil {
				j.Opts.Metadata = map[string]any{}
			}
			j.Opts.Metadata[MetadataKey] = map[string]string(carrier) // only encoded: shared by the batch
		}
	}
	if err := next(ctx); err != nil {
		span.SetStatus(codes.Error, err.Error())
		return err
	}
	if len(jobs) == 1 && jobs[0].Result != nil {
		r := jobs[0].Result
		span.SetAttributes(semconv.MessagingMessageID(strconv.FormatInt(r.Job.ID, 10)), AttrJobExisting.Bool(r.Existing))
	}
	return nil
}

// common returns the value every job has for f, if they all have the same.
func common(jobs []*fenceq.InsertJob, f func(*fenceq.InsertJob) string) (string, bool) {
	if len(jobs) == 0 {
		return "", false
	}
	v := f(jobs[0])
	for _, j := range jobs[1:] {
		if f(j) != v {
			return "", false
		}
	}
	return v, v != ""
}

// attemptKey keys the attempt's span in the context handed on by Work, for the hooks.
type attemptKey struct{ t *Tracing }

// Work is work middleware: it starts the attempt's consumer span, a child of the span
// whose context the job's metadata carries, and hands it on in the context; the
// JobFinished hook ends it.
func (t *Tracing) Work(ctx context.Context, job *queue.JobRow, next func(context.Context) error) error {
	parent := t.prop.Extract(ctx, carrierOf(job.Metadata))
	ctx, span := t.tracer.Start(parent, "process "+job.Queue, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(systemAttr, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("work"),
			semconv.MessagingDestinationName(job.Queue), semconv.MessagingMessageID(strconv.FormatInt(job.ID, 10)),
			AttrJobKind.String(job.Kind), AttrJobAttempt.Int(job.Attempt), AttrLeaseGen.Int64(job.LeaseGen)))
	return next(context.WithValue(ctx, attemptKey{t}, span))
}

// carrierOf reads the trace context from a job's metadata; empty when it has none.
func carrierOf(metadata json.RawMessage) propagation.MapCarrier {
	var m struct {
		TraceContext map[string]string `json:"otel"`
	}
	if len(metadata) == 0 || json.Unmarshal(metadata, &m) != nil || m.TraceContext == nil {
		return propagation.MapCarrier{}
	}
	return m.TraceContext
}

func (t *Tracing) span(ctx context.Context) (trace.Span, bool) {
	s, ok := ctx.Value(attemptKey{t}).(trace.Span)
	return s, ok
}

// JobFinished implements fenceq.JobFinishedHook: it ends the attempt's span with its
// outcome.
func (t *Tracing) JobFinished(ctx context.Context, job *queue.JobRow, res fenceq.AttemptResult) {
	s, ok := t.span(ctx)
	if !ok {
		return
	}
	s.SetAttributes(AttrJobOutcome.String(string(res.Outcome)))
	switch res.Outcome {
	case fenceq.OutcomeCompleted, fenceq.OutcomeSnoozed, fenceq.OutcomeReleased, fenceq.OutcomeWaiting:
	default:
		msg := string(res.Outcome)
		if res.Err != nil {
			msg = res.Err.Error()
		}
		s.SetStatus(codes.Error, msg)
	}
	s.End()
}

// LeaseLost implements fenceq.LeaseLostHook: an EventLeaseLost on the attempt's span.
func (t *Tracing) LeaseLost(ctx context.Context, job *queue.JobRow, holderAlive bool) {
	if s, ok := t.span(ctx); ok {
		s.AddEvent(EventLeaseLost, trace.WithAttributes(AttrLeaseGen.Int64(job.LeaseGen), AttrHolderAlive.Bool(holderAlive)))
	}
}

// StaleWriteRejected implements fenceq.StaleWriteRejectedHook: an
// EventStaleWriteRejected on the attempt's span.
func (t *Tracing) StaleWriteRejected(ctx context.Context, job *queue.JobRow, op string) {
	if s, ok := t.span(ctx); ok {
		s.AddEvent(EventStaleWriteRejected, trace.WithAttributes(AttrLeaseGen.Int64(job.LeaseGen), AttrWriteOp.String(op)))
	}
}
