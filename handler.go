package fenceq

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// HandlerFunc works one job of kind T.Kind(). Return nil to complete the job (or call
// job.Commit for a fenced transaction), an error to retry it with backoff (discarded
// after max attempts), or JobSnooze, JobCancel or JobDiscard to steer it. A panic is a
// failure with its stack trace recorded; the worker keeps running.
//
// The context is cancelled when the job's lease is lost, when its local lease deadline
// passes without a confirmed renewal, when the kind's timeout passes, and on a hard
// shutdown; context.Cause tells which.
type HandlerFunc[T JobArgs] func(ctx context.Context, job *Job[T]) error

// HandlerOpts tunes one kind.
type HandlerOpts struct {
	// Timeout bounds one attempt; 0 means no timeout (the lease is renewed as long as
	// the handler runs).
	Timeout time.Duration
	// Backoff overrides the worker's retry policy for this kind; a Backoff with any
	// field set is taken as given, its Jitter 0 meaning none. Its delay is when the
	// retry becomes due; the retry runs at the first promotion pass after that, so up to
	// one Config.ReaperInterval (5s by default) later (see Backoff).
	Backoff *queue.Backoff
	// Middleware wraps the work of this kind's jobs, inside the worker's
	// (Config.Middleware), the first outermost.
	Middleware []Middleware
	// NextRetry, when set, decides when a failed job of this kind runs again: it gets
	// the job's row and returns the instant of the retry, or the zero time to fall back
	// to queue.Backoff. Compute the instant from the row's times (AttemptedAt, the database's
	// time of this attempt's claim; RunAt; CreatedAt), not from time.Now(): the retry is
	// scheduled at AttemptedAt + (instant - AttemptedAt) by the database, so the
	// worker's clock never enters. The instant is when the retry becomes due: it runs at
	// the first promotion pass after it, up to one Config.ReaperInterval later, and an
	// instant already past retries at the next pass. It is not
	// consulted for JobDiscard, JobCancel or JobSnooze, nor once the attempts are used
	// up.
	NextRetry func(job *queue.JobRow) time.Time
}

// Handlers maps job kinds to handlers. Build one with NewHandlers and AddHandler, then
// pass it in Config.Handlers.
type Handlers struct {
	m map[string]*handlerEntry
}

type handlerEntry struct {
	opts HandlerOpts
	run  func(ctx context.Context, row *queue.JobRow, e *execution) error
}

// NewHandlers returns an empty registry.
func NewHandlers() *Handlers { return &Handlers{m: map[string]*handlerEntry{}} }

// AddHandler registers fn for the kind named by T's Kind method, with opts (nil for
// none). It panics if the kind is invalid or already registered: both are programming
// errors found at startup.
func AddHandler[T JobArgs](hs *Handlers, fn HandlerFunc[T], opts *HandlerOpts) {
	if err := AddHandlerSafely(hs, fn, opts); err != nil {
		panic(err)
	}
}

// AddHandlerSafely is AddHandler returning an error instead of panicking.
func AddHandlerSafely[T JobArgs](hs *Handlers, fn HandlerFunc[T], opts *HandlerOpts) error {
	var zero T
	return addHandler(hs, zero.Kind(), fn, opts)
}

// AddRawHandler registers fn for kind, whose args it gets as encoded JSON (RawArgs, with
// KindName set to kind) rather than as a Go type: for kinds a program learns at run time,
// such as a standalone worker configured to forward kinds to HTTP endpoints. It fails for
// an invalid kind, a kind already registered, or invalid opts.
func AddRawHandler(hs *Handlers, kind string, fn HandlerFunc[RawArgs], opts *HandlerOpts) error {
	if fn == nil {
		return fmt.Errorf("add handler for kind %q: nil handler", kind)
	}
	return addHandler(hs, kind, func(ctx context.Context, job *Job[RawArgs]) error {
		job.Args.KindName = kind
		return fn(ctx, job)
	}, opts)
}

func addHandler[T JobArgs](hs *Handlers, kind string, fn HandlerFunc[T], opts *HandlerOpts) error {
	if err := queue.ValidateKind(kind); err != nil {
		return fmt.Errorf("add handler: %w", err)
	}
	if _, dup := hs.m[kind]; dup {
		return fmt.Errorf("add handler: kind %q is already registered", kind)
	}
	var o HandlerOpts
	if opts != nil {
		o = *opts
		o.Middleware = append([]Middleware(nil), opts.Middleware...)
	}
	for i, mw := range o.Middleware {
		if mw == nil {
			return fmt.Errorf("add handler for kind %q: HandlerOpts.Middleware[%d]: nil", kind, i)
		}
	}
	if o.Backoff != nil {
		if err := o.Backoff.Validate(); err != nil {
			return fmt.Errorf("add handler for kind %q: HandlerOpts.%w", kind, err)
		}
		b := *o.Backoff
		o.Backoff = &b
	}
	hs.m[kind] = &handlerEntry{opts: o, run: func(ctx context.Context, row *queue.JobRow, e *execution) error {
		job := &Job[T]{JobRow: row, exec: e}
		if err := json.Unmarshal(row.EncodedArgs, &job.Args); err != nil {
			// Args that do not decode will never decode: retrying cannot help.
			return JobDiscard(fmt.Errorf("decode %s args: %w", kind, err))
		}
		return fn(ctx, job)
	}}
	return nil
}

// Kinds returns the registered kinds.
func (hs *Handlers) Kinds() []string {
	out := make([]string, 0, len(hs.m))
	for k := range hs.m {
		out = append(out, k)
	}
	return out
}
