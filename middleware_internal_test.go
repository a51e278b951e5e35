package fenceq

import (
	"context"
	"errors"
	"testing"

	"github.com/fenceq/fenceq/queue"
)

// With no middleware and no hooks, running a job's work, its hooks and the context
// look-ups of an enqueue allocate nothing: the per-job path of a worker without
// extensions is what it was before they existed.
//
// Not parallel: testing.AllocsPerRun counts the allocations of the whole process.
func TestNoMiddlewareNoHooksAllocateNothing(t *testing.T) {
	w := &Worker{}
	h := &handlerEntry{run: func(context.Context, *queue.JobRow, *execution) error { return nil }}
	e := &execution{w: w, handler: h, row: &queue.JobRow{}}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	e.jctx = jobContext{Context: ctx, e: e}
	allocs := testing.AllocsPerRun(1000, func() {
		jc := context.Context(&e.jctx)
		w.hooks.jobStarted(jc, e.row)
		if err := e.work(jc); err != nil {
			t.Fatal(err)
		}
		if inserterFrom(jc) != nil {
			t.Fatal("a worker without insert middleware put an Inserter in the job's context")
		}
		w.hooks.jobFinished(e.hookCtx(), e.row, AttemptResult{Outcome: OutcomeCompleted})
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per job, want 0", allocs)
	}
}

// Contexts derived from a job's context are cancelled with it, with its cause, and find
// the execution and the worker's Inserter through it.
func TestJobContextIsTheCancellableContext(t *testing.T) {
	t.Parallel()
	w := &Worker{inserter: NewInserter()}
	e := &execution{w: w, row: &queue.JobRow{}}
	ctx, cancel := context.WithCancelCause(context.Background())
	e.jctx = jobContext{Context: ctx, e: e}
	child, stop := context.WithCancel(context.WithValue(&e.jctx, ctxKey(99), "x"))
	defer stop()
	if child.Value(executionKey) != e || inserterFrom(child) != w.inserter {
		t.Fatal("a derived context does not find the execution and the Inserter")
	}
	cancel(queue.ErrLeaseLost)
	<-child.Done()
	if !errors.Is(context.Cause(child), queue.ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", context.Cause(child))
	}
}
