package demo

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestGate(t *testing.T) {
	t.Parallel()
	var g gate
	if err := g.wait(t.Context()); err != nil {
		t.Fatalf("wait on an open gate: %v", err)
	}
	g.close()
	waited := make(chan error, 1)
	go func() { waited <- g.wait(t.Context()) }()
	select {
	case err := <-waited:
		t.Fatalf("wait on a closed gate returned %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.open()
	if err := <-waited; err != nil {
		t.Fatalf("wait after open: %v", err)
	}

	g.close()
	defer g.open()
	stop := errors.New("stopped")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(stop)
	if err := g.wait(ctx); !errors.Is(err, stop) {
		t.Fatalf("wait with an ended context: %v, want its cause", err)
	}
}
