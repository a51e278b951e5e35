package cli_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

// enqueue and periodic add accept a kind the binary does not know while a live worker
// registers it in fenceq_workers.kinds, and refuse it, naming both lists, once that
// worker is gone.
func TestAdminCommandsAcceptLiveWorkersKinds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const kind = "ext.greet"
	// Before any worker registers the kind, it is unknown.
	r := b.run(t, "enqueue", kind)
	oneErrorLine(t, r, `unknown kind "ext.greet": this binary knows housekeeping.idempotency, invoice, noop`)
	if !strings.Contains(r.stderr, "live workers run none") || r.code != 2 {
		t.Fatalf("enqueue before the worker: exit %d, %q", r.code, r.stderr)
	}

	hs := fenceq.NewHandlers()
	if err := fenceq.AddRawHandler(hs, kind, func(ctx context.Context, job *fenceq.Job[fenceq.RawArgs]) error {
		return nil
	}, nil); err != nil {
		t.Fatal(err)
	}
	// The worker serves a queue of its own: it must not claim the jobs this test
	// enqueues, so that they stay visible below.
	w, err := fenceq.NewWorker(b.db.NewPool(t, 4), fenceq.Config{Handlers: hs, ID: "ext-worker",
		Queues: map[string]fenceq.QueueConfig{"ext-elsewhere": {MaxWorkers: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = w.Stop(context.Background())
		}
	})
	fenceqtest.WaitFor(t, "the worker registering "+kind, 30*time.Second, func() bool {
		ws, err := fenceq.ListWorkers(b.ctx, b.db.Pool)
		return err == nil && slices.ContainsFunc(ws, func(wi queue.WorkerInfo) bool { return slices.Contains(wi.Kinds, kind) })
	})

	out := b.ok(t, "enqueue", kind, "--args", `{"name": "ada"}`)
	if !strings.Contains(out, "(ext.greet, queue default)") {
		t.Errorf("enqueue %s printed %q", kind, out)
	}
	out = b.ok(t, "periodic", "add", "ext-daily", "--schedule", "@daily", "--kind", kind)
	if !strings.Contains(out, "kind ext.greet") {
		t.Errorf("periodic add printed %q", out)
	}
	r = b.run(t, "enqueue", "other.kind")
	oneErrorLine(t, r, `unknown kind "other.kind"`)
	if !strings.Contains(r.stderr, "live workers run "+kind+" (or pass --allow-unknown-kind)") || r.code != 2 {
		t.Errorf("enqueue other.kind: exit %d, %q; want both lists and exit 2", r.code, r.stderr)
	}
	r = b.run(t, "periodic", "add", "other-daily", "--schedule", "@daily", "--kind", "other.kind")
	oneErrorLine(t, r, `--kind: unknown kind "other.kind"`)

	// A worker that deregistered no longer vouches for its kinds.
	if err := w.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	stopped = true
	oneErrorLine(t, b.run(t, "enqueue", kind), `unknown kind "ext.greet"`)
	// The override still enqueues it.
	if out := b.ok(t, "enqueue", kind, "--allow-unknown-kind"); !strings.Contains(out, "ext.greet") {
		t.Errorf("enqueue --allow-unknown-kind printed %q", out)
	}
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs WHERE kind = $1`, kind).Scan(&n); err != nil || n != 2 {
		t.Errorf("%d jobs of %s (%v), want the 2 enqueued", n, kind, err)
	}
}
