package fenceq

import (
	"context"
	"fmt"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// Middleware wraps the work of one attempt of a job: it runs before the handler, calls
// next to go on (to the next middleware, and finally to the handler), and returns the
// attempt's result, which decides the job's outcome exactly as a handler's would: nil
// completes the job, an error retries it, JobSnooze, JobCancel and JobDiscard steer it.
// A middleware that returns without calling next skips the handler; a panic in it is
// recovered and recorded like a handler's.
//
// job is the row the handler sees (Job[T].JobRow): its kind, queue, attempt, lease
// generation and metadata (queue.JobRow.Metadata, the JSON object its enqueue wrote, where
// insert middleware puts what travels with a job, such as a trace context). It is
// shared with the handler and the hooks: read it, do not modify it. A middleware passes
// values to the handler and to the hooks in the context it gives next.
//
// Worker-level middleware (Config.Middleware) runs outside per-handler middleware
// (HandlerOpts.Middleware), each list in the order given: the first is the outermost.
type Middleware func(ctx context.Context, job *queue.JobRow, next func(ctx context.Context) error) error

// InsertMiddleware wraps one enqueue: a single job (Enqueue, in a transaction or not)
// or a COPY batch (EnqueueMany), which it sees as one call with every job of the batch.
// It may read and change each job's options, and add to its metadata, before calling
// next, which validates and inserts them; after next returns, a single enqueue's
// InsertJob.Result holds the job. A middleware that returns nil without calling next
// makes the enqueue fail: nothing was inserted.
type InsertMiddleware func(ctx context.Context, jobs []*InsertJob, next func(ctx context.Context) error) error

// InsertJob is one job being enqueued, as insert middleware sees it.
type InsertJob struct {
	// Args are the job's arguments, as given to Enqueue.
	Args JobArgs
	// Kind is Args.Kind().
	Kind string
	// Opts are the options the job is inserted with: the caller's over the kind's (see
	// InsertOpts). Queue is resolved ("default" when none was given) and Metadata is
	// never nil, a map of this job's own, so that middleware can add keys to it.
	Opts InsertOpts
	// Result is set when next returned nil for a single enqueue: the inserted job, or
	// the existing one its unique key matched. EnqueueMany leaves it nil (COPY returns
	// no rows).
	Result *queue.InsertResult
}

// Inserter enqueues jobs through insert middleware. Configure one for the
// application's own enqueues, with the same middleware as the worker's
// Config.InsertMiddleware:
//
//	ins := fenceq.NewInserter(tracing.Insert)
//	ins.Enqueue(ctx, pool, args, nil)
//
// Enqueues made inside a running handler go through the worker's insert middleware
// without one: the handler's context carries the worker's Inserter, and the package
// functions Enqueue and EnqueueMany (and what is built on them, such as outbox.Insert)
// use the Inserter of their context (see WithInserter). An Inserter's own methods
// always use its own middleware, whatever the context carries.
//
// The zero Inserter and a nil *Inserter have no middleware. An Inserter is safe for
// concurrent use.
type Inserter struct {
	mws []InsertMiddleware
}

// NewInserter returns an Inserter whose enqueues go through mws, the first outermost.
func NewInserter(mws ...InsertMiddleware) *Inserter {
	return &Inserter{mws: append([]InsertMiddleware(nil), mws...)}
}

// ctxKey keys the values a context carries for this package.
type ctxKey int

const (
	inserterKey  ctxKey = iota // the *Inserter of package-level enqueues
	executionKey               // the *execution of the running job
)

// WithInserter returns a copy of ctx whose package-level Enqueue and EnqueueMany go
// through ins: for code that enqueues through libraries (outbox.Insert, say) outside a
// worker's handlers, such as an HTTP handler.
func WithInserter(ctx context.Context, ins *Inserter) context.Context {
	return context.WithValue(ctx, inserterKey, ins)
}

// inserterFrom returns the Inserter ctx carries, nil for none.
func inserterFrom(ctx context.Context) *Inserter {
	ins, _ := ctx.Value(inserterKey).(*Inserter)
	return ins
}

// Enqueue inserts one job through the Inserter's middleware. See the package function
// Enqueue.
func (i *Inserter) Enqueue(ctx context.Context, db queue.DBTX, args JobArgs, opts *InsertOpts) (*queue.InsertResult, error) {
	if i == nil || len(i.mws) == 0 {
		p, err := insertParams(args, mergeOpts(args, opts, false))
		if err != nil {
			return nil, err
		}
		return store.Insert(ctx, db, p)
	}
	job := newInsertJob(args, opts)
	err := runInsert(ctx, i.mws, []*InsertJob{job}, func(ctx context.Context) error {
		p, err := insertParams(job.Args, job.Opts)
		if err != nil {
			return err
		}
		res, err := store.Insert(ctx, db, p)
		if err != nil {
			return err
		}
		job.Result = res
		return nil
	})
	if err != nil {
		return nil, err
	}
	if job.Result == nil {
		return nil, fmt.Errorf("enqueue %s job: insert middleware returned without calling next: nothing was inserted", job.Kind)
	}
	return job.Result, nil
}

// EnqueueMany inserts a batch with COPY through the Inserter's middleware, which sees
// the whole batch. See the package function EnqueueMany.
func (i *Inserter) EnqueueMany(ctx context.Context, db queue.Beginner, items []EnqueueItem) (int64, error) {
	if i == nil || len(i.mws) == 0 {
		return enqueueMany(ctx, db, len(items), func(k int) (JobArgs, InsertOpts) {
			return items[k].Args, mergeOpts(items[k].Args, items[k].Opts, false)
		})
	}
	jobs := make([]*InsertJob, len(items))
	for k, it := range items {
		jobs[k] = newInsertJob(it.Args, it.Opts)
	}
	var n int64
	called := false
	err := runInsert(ctx, i.mws, jobs, func(ctx context.Context) error {
		called = true
		var err error
		n, err = enqueueMany(ctx, db, len(jobs), func(k int) (JobArgs, InsertOpts) { return jobs[k].Args, jobs[k].Opts })
		return err
	})
	if err != nil {
		return n, err
	}
	if !called {
		return 0, fmt.Errorf("enqueue %d jobs: insert middleware returned without calling next: nothing was inserted", len(jobs))
	}
	return n, nil
}

func newInsertJob(args JobArgs, opts *InsertOpts) *InsertJob {
	job := &InsertJob{Args: args, Opts: mergeOpts(args, opts, true)}
	if args != nil {
		job.Kind = args.Kind()
	}
	return job
}

// runInsert runs the insert middleware around insert.
func runInsert(ctx context.Context, mws []InsertMiddleware, jobs []*InsertJob, insert func(ctx context.Context) error) error {
	var call func(ctx context.Context, k int) error
	call = func(ctx context.Context, k int) error {
		if k == len(mws) {
			return insert(ctx)
		}
		return mws[k](ctx, jobs, func(ctx context.Context) error { return call(ctx, k+1) })
	}
	return call(ctx, 0)
}

// jobContext is the context a job's handler and middleware run under: the execution's
// cancellable context, answering also for the execution (RecordOutput) and for the
// worker's Inserter (enqueues inside the handler). It is a field of the execution, so
// handing it out allocates nothing. Value delegates every other key, including the
// context package's own, so contexts derived from it treat it as the cancellable
// context it embeds.
type jobContext struct {
	context.Context
	e *execution
}

// Value implements context.Context.
func (c *jobContext) Value(key any) any {
	switch key {
	case executionKey:
		return c.e
	case inserterKey:
		if ins := c.e.w.inserter; ins != nil {
			return ins
		}
	}
	return c.Context.Value(key)
}

// work runs the attempt: the worker's middleware, then the handler's, then the
// handler. With no middleware it calls the handler directly.
func (e *execution) work(ctx context.Context) error {
	if len(e.w.cfg.Middleware) == 0 && len(e.handler.opts.Middleware) == 0 {
		return e.handler.run(ctx, e.row, e)
	}
	return e.layer(ctx, 0)
}

// layer runs middleware k of the worker's followed by the handler's (the handler after
// the last). It records the context each layer hands on, so that the hooks see the
// innermost one reached, with every value the middleware around it added.
func (e *execution) layer(ctx context.Context, k int) error {
	e.mu.Lock()
	e.workCtx = ctx
	e.mu.Unlock()
	wm, hm := e.w.cfg.Middleware, e.handler.opts.Middleware
	var mw Middleware
	switch {
	case k < len(wm):
		mw = wm[k]
	case k-len(wm) < len(hm):
		mw = hm[k-len(wm)]
	default:
		return e.handler.run(ctx, e.row, e)
	}
	return mw(ctx, e.row, func(ctx context.Context) error { return e.layer(ctx, k+1) })
}

// hookCtx is the context the job's hooks get: the innermost one its middleware handed
// on, else the job's own.
func (e *execution) hookCtx() context.Context {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.workCtx != nil {
		return e.workCtx
	}
	return &e.jctx
}
