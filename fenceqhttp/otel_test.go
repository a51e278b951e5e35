package fenceqhttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqhttp"
	"github.com/fenceq/fenceq/fenceqotel"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

// injecting is a Transport that sends the request context's trace in its headers.
type injecting struct{ p propagation.TextMapPropagator }

func (i injecting) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	i.p.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	return http.DefaultTransport.RoundTrip(r)
}

// An HTTP kind's attempt is traced by fenceqotel as a Go kind's is, and the request's
// context carries the attempt's span: a Client whose Transport injects it takes the
// trace to the endpoint.
func TestTracedLikeGoKinds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	var mu sync.Mutex
	var traceparent string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		traceparent = r.Header.Get("Traceparent")
		mu.Unlock()
	}))
	defer srv.Close()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	prop := propagation.TraceContext{}
	tracing := fenceqotel.New(fenceqotel.Config{TracerProvider: tp, Propagator: prop})

	hs := fenceq.NewHandlers()
	if err := fenceqhttp.Add(hs, fenceqhttp.Endpoint{Kind: kind, URL: srv.URL, Secret: secret,
		Client: &http.Client{Transport: injecting{prop}}}); err != nil {
		t.Fatal(err)
	}
	cfg := fenceq.Config{Handlers: hs, Logger: fenceqtest.QuietLogger()}
	tracing.Install(&cfg)
	j, err := fenceqtest.Work(ctx, t, db.Pool, cfg, fenceq.RawArgs{KindName: kind, JSON: []byte(args)}, nil)
	if err != nil || j.State != queue.StateCompleted {
		t.Fatalf("job %s, handler error %v; want completed", j.State, err)
	}
	var process *tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "process "+queue.DefaultQueue {
			process = &s
		}
	}
	if process == nil {
		t.Fatalf("no attempt span among %d spans", len(exp.GetSpans()))
	}
	kindSeen := false
	for _, a := range process.Attributes {
		if string(a.Key) == "fenceq.job.kind" && a.Value.AsString() == kind {
			kindSeen = true
		}
	}
	if !kindSeen {
		t.Errorf("attempt span attributes %v lack fenceq.job.kind=%s", process.Attributes, kind)
	}
	mu.Lock()
	defer mu.Unlock()
	want := process.SpanContext.TraceID().String()
	if len(traceparent) < 36 || traceparent[3:35] != want {
		t.Errorf("the endpoint got traceparent %q, want one of trace %s", traceparent, want)
	}
}
