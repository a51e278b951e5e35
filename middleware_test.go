package fenceq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

// trail records the steps of middleware and handlers, in order, from any goroutine.
type trail struct {
	mu    sync.Mutex
	steps []string
}

func (tr *trail) add(step string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.steps = append(tr.steps, step)
}

func (tr *trail) get() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.steps)
}

// around is work middleware that records name> before next and <name after it.
func around(tr *trail, name string) fenceq.Middleware {
	return func(ctx context.Context, job *queue.JobRow, next func(context.Context) error) error {
		tr.add(name + ">")
		err := next(ctx)
		tr.add("<" + name)
		return err
	}
}

// insertAround is insert middleware that records name>N (N jobs) and <name, and adds
// its name to each job's metadata.
func insertAround(tr *trail, name string) fenceq.InsertMiddleware {
	return func(ctx context.Context, jobs []*fenceq.InsertJob, next func(context.Context) error) error {
		tr.add(fmt.Sprintf("%s>%d", name, len(jobs)))
		for _, j := range jobs {
			j.Opts.Metadata[name] = j.Kind
		}
		err := next(ctx)
		tr.add("<" + name)
		return err
	}
}

type mwKey struct{}

type mwArgs struct {
	Mode string `json:"mode"`
}

func (mwArgs) Kind() string { return "mw" }

// Worker-level middleware runs outside per-handler middleware, each list in the order
// given; values a middleware puts in the context reach the handler.
func TestWorkMiddlewareOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tr := &trail{}
	done := make(chan any, 1)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[mwArgs]) error {
		tr.add("handler")
		done <- ctx.Value(mwKey{})
		return nil
	}, &fenceq.HandlerOpts{Middleware: []fenceq.Middleware{around(tr, "H1"), around(tr, "H2")}})
	cfg := b.fastConfig(5 * time.Second)
	cfg.Middleware = []fenceq.Middleware{
		around(tr, "W1"),
		func(ctx context.Context, job *queue.JobRow, next func(context.Context) error) error {
			return next(context.WithValue(ctx, mwKey{}, fmt.Sprintf("job %d gen %d", job.ID, job.LeaseGen)))
		},
		around(tr, "W2"),
	}
	b.startWorker(t, cfg)
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, mwArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := recv(t, done, 10*time.Second, "the handler"); v != fmt.Sprintf("job %d gen 1", res.Job.ID) {
		t.Errorf("handler's context value %v, want the middleware's", v)
	}
	fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, 10*time.Second)
	want := []string{"W1>", "W2>", "H1>", "H2>", "handler", "<H2", "<H1", "<W2", "<W1"}
	if got := tr.get(); !slices.Equal(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
}

type childArgs struct {
	N int `json:"n"`
}

func (childArgs) Kind() string { return "child" }

// Insert middleware wraps the application's enqueues through an Inserter (single, in a
// transaction, a COPY batch as one call) and, through the handler's context, the
// enqueues of a running handler; it adds to the jobs' metadata, which work middleware
// reads. The package functions outside a handler use none.
func TestInsertMiddleware(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tr := &trail{}
	mws := []fenceq.InsertMiddleware{insertAround(tr, "I1"), insertAround(tr, "I2")}
	var mu sync.Mutex
	seen := map[int64]map[string]any{} // job id → metadata, as work middleware read it
	cfg := b.fastConfig(5 * time.Second)
	cfg.InsertMiddleware = mws
	cfg.Middleware = []fenceq.Middleware{func(ctx context.Context, job *queue.JobRow, next func(context.Context) error) error {
		var meta map[string]any
		if err := json.Unmarshal(job.Metadata, &meta); err != nil {
			return err
		}
		mu.Lock()
		seen[job.ID] = meta
		mu.Unlock()
		return next(ctx)
	}}
	children := make(chan []int64, 1)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[mwArgs]) error {
		tr.add("handler")
		one, err := fenceq.Enqueue(ctx, b.db.Pool, childArgs{N: 1}, nil)
		if err != nil {
			return err
		}
		n, err := fenceq.EnqueueMany(ctx, b.db.Pool, []fenceq.EnqueueItem{{Args: childArgs{N: 2}}, {Args: childArgs{N: 3}}})
		if err != nil || n != 2 {
			return fmt.Errorf("enqueue many: %d, %v", n, err)
		}
		children <- []int64{one.Job.ID}
		return nil
	}, nil)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[childArgs]) error { return nil }, nil)
	b.startWorker(t, cfg)

	// The application's enqueue, in its own transaction.
	ins := fenceq.NewInserter(mws...)
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	parent, err := ins.Enqueue(b.ctx, tx, mwArgs{}, &fenceq.InsertOpts{Metadata: map[string]any{"caller": "test"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	single := recv(t, children, 10*time.Second, "the parent's enqueues")[0]
	fenceqtest.WaitState(t, b.db.Pool, parent.Job.ID, queue.StateCompleted, 10*time.Second)

	want := []string{"I1>1", "I2>1", "<I2", "<I1", // the application's enqueue
		"handler", "I1>1", "I2>1", "<I2", "<I1", // Enqueue in the handler
		"I1>2", "I2>2", "<I2", "<I1"} // EnqueueMany in the handler: one call for the batch
	if got := tr.get(); !slices.Equal(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	// Every job carries what the insert middleware added (and the caller's own keys).
	rows, err := b.db.Pool.Query(b.ctx, `SELECT id, kind, metadata FROM fenceq_jobs ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID       int64
		Kind     string
		Metadata map[string]any
	}
	var all []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.ID, &r.Kind, &r.Metadata); err != nil {
			t.Fatal(err)
		}
		all = append(all, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 {
		t.Fatalf("%d jobs, want the parent and 3 children: %+v", len(all), all)
	}
	for _, r := range all {
		if r.Metadata["I1"] != r.Kind || r.Metadata["I2"] != r.Kind {
			t.Errorf("job %d (%s) metadata %v lacks the insert middleware's keys", r.ID, r.Kind, r.Metadata)
		}
		if r.Kind == "mw" && r.Metadata["caller"] != "test" {
			t.Errorf("parent metadata %v lacks the caller's key", r.Metadata)
		}
	}
	// Work middleware read the metadata of the jobs it ran.
	for _, r := range all {
		fenceqtest.WaitState(t, b.db.Pool, r.ID, queue.StateCompleted, 10*time.Second)
	}
	mu.Lock()
	if m := seen[single]; m["I1"] != "child" {
		t.Errorf("work middleware saw metadata %v of job %d, want the insert middleware's", m, single)
	}
	mu.Unlock()

	// Outside a handler, the package functions go through no middleware, unless the
	// context carries an Inserter.
	plain, err := fenceq.Enqueue(b.ctx, b.db.Pool, childArgs{N: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(plain.Job.Metadata) != "{}" {
		t.Errorf("plain Enqueue wrote metadata %s", plain.Job.Metadata)
	}
	viaCtx, err := fenceq.Enqueue(fenceq.WithInserter(b.ctx, ins), b.db.Pool, childArgs{N: 5}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(viaCtx.Job.Metadata), `"I1"`) {
		t.Errorf("Enqueue with WithInserter wrote metadata %s", viaCtx.Job.Metadata)
	}
}

// An insert middleware's error fails the enqueue, and one that does not call next
// fails it too: in both cases nothing is inserted.
func TestInsertMiddlewareErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boom := errors.New("quota exceeded")
	refuse := fenceq.NewInserter(func(ctx context.Context, jobs []*fenceq.InsertJob, next func(context.Context) error) error {
		return boom
	})
	skip := fenceq.NewInserter(func(ctx context.Context, jobs []*fenceq.InsertJob, next func(context.Context) error) error {
		return nil
	})
	if _, err := refuse.Enqueue(b.ctx, b.db.Pool, childArgs{}, nil); !errors.Is(err, boom) {
		t.Errorf("Enqueue: %v, want the middleware's error", err)
	}
	if _, err := refuse.EnqueueMany(b.ctx, b.db.Pool, []fenceq.EnqueueItem{{Args: childArgs{}}}); !errors.Is(err, boom) {
		t.Errorf("EnqueueMany: %v, want the middleware's error", err)
	}
	if _, err := skip.Enqueue(b.ctx, b.db.Pool, childArgs{}, nil); err == nil || !strings.Contains(err.Error(), "nothing was inserted") {
		t.Errorf("Enqueue past a middleware that skips next: %v", err)
	}
	if _, err := skip.EnqueueMany(b.ctx, b.db.Pool, []fenceq.EnqueueItem{{Args: childArgs{}}}); err == nil || !strings.Contains(err.Error(), "nothing was inserted") {
		t.Errorf("EnqueueMany past a middleware that skips next: %v", err)
	}
	// Invalid options changed by a middleware are still validated by next.
	bad := fenceq.NewInserter(func(ctx context.Context, jobs []*fenceq.InsertJob, next func(context.Context) error) error {
		jobs[0].Opts.Queue = "no spaces allowed"
		return next(ctx)
	})
	if _, err := bad.Enqueue(b.ctx, b.db.Pool, childArgs{}, nil); !errors.Is(err, queue.ErrInvalid) {
		t.Errorf("Enqueue with an invalid queue set by middleware: %v, want ErrInvalid", err)
	}
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d jobs inserted (%v), want none", n, err)
	}
}

// A middleware's error fails the attempt like a handler's; a middleware that returns
// without calling next skips the handler (nil completes the job); a panic in a
// middleware is recovered and recorded with its stack; an error after next fails an
// attempt whose handler succeeded.
func TestWorkMiddlewareErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	ran := map[string]int{}
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[mwArgs]) error {
		mu.Lock()
		ran[job.Args.Mode]++
		mu.Unlock()
		return nil
	}, nil)
	cfg := b.fastConfig(5 * time.Second)
	cfg.Middleware = []fenceq.Middleware{func(ctx context.Context, job *queue.JobRow, next func(context.Context) error) error {
		var args mwArgs
		if err := json.Unmarshal(job.EncodedArgs, &args); err != nil {
			return err
		}
		switch args.Mode {
		case "error":
			return errors.New("middleware refused the job")
		case "skip":
			return nil
		case "panic":
			panic("middleware blew up")
		case "after":
			if err := next(ctx); err != nil {
				return err
			}
			return errors.New("middleware failed after the handler")
		case "cancel":
			return fenceq.JobCancel(errors.New("not for this tenant"))
		}
		return next(ctx)
	}}
	b.startWorker(t, cfg)
	ids := map[string]int64{}
	for _, m := range []string{"ok", "error", "skip", "panic", "after", "cancel"} {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, mwArgs{Mode: m}, &fenceq.InsertOpts{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		ids[m] = res.Job.ID
	}
	cases := []struct {
		mode    string
		state   queue.State
		errText string // in the attempt's recorded error; "" for none
		ran     int    // times the handler ran
	}{
		{"ok", queue.StateCompleted, "", 1},
		{"error", queue.StateDiscarded, "middleware refused the job", 0},
		{"skip", queue.StateCompleted, "", 0},
		{"panic", queue.StateDiscarded, "panic: middleware blew up", 0},
		{"after", queue.StateDiscarded, "middleware failed after the handler", 1},
		{"cancel", queue.StateCancelled, "not for this tenant", 0},
	}
	for _, c := range cases {
		j := fenceqtest.WaitState(t, b.db.Pool, ids[c.mode], c.state, 10*time.Second)
		switch {
		case c.errText == "" && len(j.Errors) != 0:
			t.Errorf("%s: errors %+v, want none", c.mode, j.Errors)
		case c.errText != "" && (len(j.Errors) != 1 || !strings.Contains(j.Errors[0].Error, c.errText)):
			t.Errorf("%s: errors %+v, want one with %q", c.mode, j.Errors, c.errText)
		}
		if c.mode == "panic" && (len(j.Errors) != 1 || !strings.Contains(j.Errors[0].Trace, "goroutine")) {
			t.Errorf("panic: no stack recorded: %+v", j.Errors)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, c := range cases {
		if ran[c.mode] != c.ran {
			t.Errorf("%s: handler ran %d times, want %d", c.mode, ran[c.mode], c.ran)
		}
	}
}

func TestMiddlewareAndHookValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[mwArgs]) error { return nil }, nil)
	cases := map[string]fenceq.Config{
		"Middleware[1]":       {Handlers: b.hs, Middleware: []fenceq.Middleware{around(&trail{}, "x"), nil}},
		"InsertMiddleware[0]": {Handlers: b.hs, InsertMiddleware: []fenceq.InsertMiddleware{nil}},
		"Hooks[0]":            {Handlers: b.hs, Hooks: []fenceq.Hook{42}},
	}
	for field, cfg := range cases {
		if _, err := fenceq.NewWorker(b.db.Pool, cfg); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err = %v, want it named", field, err)
		}
	}
	err := fenceq.AddHandlerSafely(fenceq.NewHandlers(), func(ctx context.Context, job *fenceq.Job[mwArgs]) error { return nil },
		&fenceq.HandlerOpts{Middleware: []fenceq.Middleware{nil}})
	if err == nil || !strings.Contains(err.Error(), "HandlerOpts.Middleware[0]") {
		t.Errorf("nil handler middleware: %v", err)
	}
}
