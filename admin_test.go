package fenceq_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

type opArgs struct {
	N int `json:"n"`
}

func (opArgs) Kind() string { return "op" }

type otherArgs struct{}

func (otherArgs) Kind() string { return "other" }

// enqueueN enqueues n jobs of args' kind and returns their ids in enqueue order.
func (b *testBundle) enqueueN(t *testing.T, n int, args func(i int) fenceq.JobArgs) []int64 {
	t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, args(i), nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = res.Job.ID
	}
	return ids
}

// claim takes the next available job of the default queue with a real lease, as a worker
// named holder would.
func (b *testBundle) claim(t *testing.T, holder string) *queue.JobRow {
	t.Helper()
	rows, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: queue.DefaultQueue, WorkerID: holder,
		Limit: 1, Lease: time.Minute})
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v, %d rows", err, len(rows))
	}
	return rows[0]
}

func TestDeleteJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueueN(t, 2, func(i int) fenceq.JobArgs { return opArgs{N: i} })
	running := b.claim(t, "holder")

	if _, err := fenceq.DeleteJob(b.ctx, b.db.Pool, running.ID); !errors.Is(err, queue.ErrWrongState) {
		t.Fatalf("delete a running job: %v, want ErrWrongState", err)
	}
	if j, err := fenceq.GetJob(b.ctx, b.db.Pool, running.ID); err != nil || j.State != queue.StateRunning {
		t.Fatalf("the refused delete changed the running job: %v, %v", j, err)
	}
	other := ids[0]
	if other == running.ID {
		other = ids[1]
	}
	deleted, err := fenceq.DeleteJob(b.ctx, b.db.Pool, other)
	if err != nil || deleted.ID != other {
		t.Fatalf("delete job %d: %v, %v", other, deleted, err)
	}
	if _, err := fenceq.GetJob(b.ctx, b.db.Pool, other); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("get a deleted job: %v, want ErrNotFound", err)
	}
	if _, err := fenceq.DeleteJob(b.ctx, b.db.Pool, other); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("delete it again: %v, want ErrNotFound", err)
	}
}

func TestBulkActionsByFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ops := b.enqueueN(t, 5, func(i int) fenceq.JobArgs { return opArgs{N: i} })
	others := b.enqueueN(t, 2, func(int) fenceq.JobArgs { return otherArgs{} })
	held := b.claim(t, "stale-holder") // the oldest job: an op, now running under a lease

	if _, err := fenceq.CancelJobs(b.ctx, b.db.Pool, queue.ListParams{}, ""); !errors.Is(err, fenceq.ErrEmptyFilter) {
		t.Fatalf("cancel with an empty filter: %v, want ErrEmptyFilter", err)
	}
	for _, id := range append(slices.Clone(ops), others...) {
		if j, err := fenceq.GetJob(b.ctx, b.db.Pool, id); err != nil || j.State.Final() {
			t.Fatalf("the refused bulk action changed job %d: %v, %v", id, j, err)
		}
	}

	// Two jobs a page, so the action must page through the filter's matches.
	res, err := fenceq.CancelJobs(b.ctx, b.db.Pool, queue.ListParams{Kind: "op", Limit: 2}, "bulk")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(res.Changed)
	if res.Matched != len(ops) || res.Skipped != 0 || !slices.Equal(res.Changed, ops) {
		t.Fatalf("cancel kind op: %+v, want all of %v changed", res, ops)
	}
	for _, id := range ops {
		j, err := fenceq.GetJob(b.ctx, b.db.Pool, id)
		if err != nil || j.State != queue.StateCancelled {
			t.Fatalf("job %d after the bulk cancel: %v, %v", id, j, err)
		}
	}
	for _, id := range others {
		j, err := fenceq.GetJob(b.ctx, b.db.Pool, id)
		if err != nil || j.State != queue.StateAvailable {
			t.Fatalf("job %d of another kind after the bulk cancel: %v, %v", id, j, err)
		}
	}
	// The bulk cancel revoked the running job's lease: its holder can write nothing.
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(held)); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("the stale holder's completion after a bulk cancel: %v, want ErrLeaseLost", err)
	}

	// A second cancel finds the same jobs, all finished now: skipped, not errors.
	res, err = fenceq.CancelJobs(b.ctx, b.db.Pool, queue.ListParams{Kind: "op"}, "")
	if err != nil || res.Matched != len(ops) || res.Skipped != len(ops) || len(res.Changed) != 0 {
		t.Fatalf("cancel finished jobs: %+v, %v", res, err)
	}

	res, err = fenceq.RetryJobs(b.ctx, b.db.Pool, queue.ListParams{State: queue.StateCancelled})
	if err != nil || len(res.Changed) != len(ops) {
		t.Fatalf("retry the cancelled jobs: %+v, %v", res, err)
	}
	res, err = fenceq.DeleteJobs(b.ctx, b.db.Pool, queue.ListParams{Kind: "other"})
	if err != nil || len(res.Changed) != len(others) {
		t.Fatalf("delete kind other: %+v, %v", res, err)
	}
	page, err := fenceq.ListJobs(b.ctx, b.db.Pool, queue.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Jobs) != len(ops) {
		t.Fatalf("after the bulk actions %d jobs remain, want the %d retried ones", len(page.Jobs), len(ops))
	}
	for _, j := range page.Jobs {
		if j.Kind != "op" || j.State != queue.StateAvailable {
			t.Fatalf("job %d after the bulk actions: %s %s", j.ID, j.Kind, j.State)
		}
	}
}

func TestQueueAddRemove(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listed := func() map[string]queue.QueueInfo {
		t.Helper()
		qs, err := fenceq.ListQueues(b.ctx, b.db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]queue.QueueInfo{}
		for _, q := range qs {
			m[q.Name] = q
		}
		return m
	}
	if err := fenceq.AddQueue(b.ctx, b.db.Pool, "bad name"); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("add a queue with an invalid name: %v, want ErrInvalid", err)
	}
	if err := fenceq.AddQueue(b.ctx, b.db.Pool, "reports"); err != nil {
		t.Fatal(err)
	}
	if _, ok := listed()["reports"]; !ok {
		t.Fatal("an added queue is not listed")
	}
	if err := fenceq.AddQueue(b.ctx, b.db.Pool, "reports"); !errors.Is(err, queue.ErrExists) {
		t.Fatalf("add it again: %v, want ErrExists", err)
	}
	if err := fenceq.PauseQueue(b.ctx, b.db.Pool, "reports"); err != nil {
		t.Fatal(err)
	}
	if !listed()["reports"].Paused {
		t.Fatal("PauseQueue left the queue unpaused")
	}
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, opArgs{}, &fenceq.InsertOpts{Queue: "reports"})
	if err != nil {
		t.Fatal(err)
	}
	if err := fenceq.RemoveQueue(b.ctx, b.db.Pool, "reports"); !errors.Is(err, queue.ErrWrongState) {
		t.Fatalf("remove a queue with a waiting job: %v, want ErrWrongState", err)
	}
	if !listed()["reports"].Paused {
		t.Fatal("the refused remove dropped the queue's settings")
	}
	if _, err := fenceq.CancelJob(b.ctx, b.db.Pool, res.Job.ID, ""); err != nil {
		t.Fatal(err)
	}
	if err := fenceq.RemoveQueue(b.ctx, b.db.Pool, "reports"); err != nil {
		t.Fatal(err)
	}
	if q := listed()["reports"]; q.Paused {
		t.Fatal("the removed queue's pause outlived its settings row")
	}
	if err := fenceq.RemoveQueue(b.ctx, b.db.Pool, "reports"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("remove it again: %v, want ErrNotFound", err)
	}
}

func TestRunJobRefusesWhatItCannotClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(context.Context, *fenceq.Job[opArgs]) error { return nil }, nil)
	newWorker := func() *fenceq.Worker {
		t.Helper()
		w, err := fenceq.NewWorker(b.db.Pool, fenceq.Config{Handlers: b.hs})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	later, err := fenceq.Enqueue(b.ctx, b.db.Pool, opArgs{}, &fenceq.InsertOpts{RunIn: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newWorker().RunJob(b.ctx, later.Job.ID); !errors.Is(err, fenceq.ErrNotClaimable) {
		t.Fatalf("run a scheduled job: %v, want ErrNotClaimable", err)
	}
	if _, err := newWorker().RunJob(b.ctx, later.Job.ID+1000); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("run a job that does not exist: %v, want ErrNotFound", err)
	}
	unknown, err := fenceq.Enqueue(b.ctx, b.db.Pool, otherArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newWorker().RunJob(b.ctx, unknown.Job.ID); err == nil {
		t.Fatal("RunJob ran a kind with no handler")
	}
	now, err := fenceq.Enqueue(b.ctx, b.db.Pool, opArgs{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	run, err := newWorker().RunJob(b.ctx, now.Job.ID)
	if err != nil || run.HandlerErr != nil || run.Job.State != queue.StateCompleted || run.Job.LeaseGen != 1 {
		t.Fatalf("run an available job: %+v, %v", run, err)
	}
	for _, id := range []int64{later.Job.ID, unknown.Job.ID} {
		if j, err := fenceq.GetJob(b.ctx, b.db.Pool, id); err != nil || j.LeaseGen != 0 {
			t.Fatalf("a refused RunJob claimed job %d: %v, %v", id, j, err)
		}
	}
}

func TestAddRawHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := fenceq.AddRawHandler(b.hs, "bad kind", func(context.Context, *fenceq.Job[fenceq.RawArgs]) error { return nil }, nil); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("an invalid kind: %v, want ErrInvalid", err)
	}
	var got fenceq.RawArgs
	if err := fenceq.AddRawHandler(b.hs, "app.greet", func(_ context.Context, job *fenceq.Job[fenceq.RawArgs]) error {
		got = job.Args
		return nil
	}, nil); err != nil {
		t.Fatal(err)
	}
	if err := fenceq.AddRawHandler(b.hs, "app.greet", func(context.Context, *fenceq.Job[fenceq.RawArgs]) error { return nil }, nil); err == nil {
		t.Fatal("a second handler for the same kind was accepted")
	}
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, fenceq.RawArgs{KindName: "app.greet", JSON: []byte(`{"name": "ada"}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := fenceq.NewWorker(b.db.Pool, fenceq.Config{Handlers: b.hs})
	if err != nil {
		t.Fatal(err)
	}
	run, err := w.RunJob(b.ctx, res.Job.ID)
	if err != nil || run.HandlerErr != nil || run.Job.State != queue.StateCompleted {
		t.Fatalf("run the raw job: %+v, %v", run, err)
	}
	if got.KindName != "app.greet" || string(got.JSON) != `{"name": "ada"}` {
		t.Fatalf("the raw handler got %q %s", got.KindName, got.JSON)
	}
}
