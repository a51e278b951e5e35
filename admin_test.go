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
	ctx := fenceq.WithActor(b.ctx, "cli:tester")

	if _, err := fenceq.CancelJobs(ctx, b.db.Pool, queue.JobFilter{}, nil); !errors.Is(err, fenceq.ErrEmptyFilter) {
		t.Fatalf("cancel with an empty filter: %v, want ErrEmptyFilter", err)
	}
	if _, err := fenceq.CancelJobs(ctx, b.db.Pool, queue.JobFilter{Kind: "op"}, &fenceq.BulkOptions{BatchSize: -1}); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("cancel with a negative batch size: %v, want ErrInvalid", err)
	}
	for _, id := range append(slices.Clone(ops), others...) {
		if j, err := fenceq.GetJob(b.ctx, b.db.Pool, id); err != nil || j.State.Final() {
			t.Fatalf("the refused bulk action changed job %d: %v, %v", id, j, err)
		}
	}

	// Two jobs a batch, so the action must page through the filter's matches.
	res, err := fenceq.CancelJobs(ctx, b.db.Pool, queue.JobFilter{Kind: "op"}, &fenceq.BulkOptions{BatchSize: 2, Reason: "bulk"})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(res.Changed)
	if res.Matched != len(ops) || res.Skipped != 0 || !slices.Equal(res.Changed, ops) || res.Batches != 3 {
		t.Fatalf("cancel kind op: %+v, want all of %v changed in 3 batches", res, ops)
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
	// One audit record per batch, naming the jobs it changed, the filter and the actor.
	recs, err := fenceq.ListAudit(b.ctx, b.db.Pool, queue.AuditParams{})
	if err != nil {
		t.Fatal(err)
	}
	var audited []int64
	for _, r := range recs {
		if r.Action != queue.AuditCancel || r.Actor != "cli:tester" || r.Filter == nil || r.Filter.Kind != "op" {
			t.Fatalf("audit record %+v", r)
		}
		audited = append(audited, r.JobIDs...)
	}
	slices.Sort(audited)
	if len(recs) != 3 || !slices.Equal(audited, ops) {
		t.Fatalf("%d audit records naming %v; want 3 naming %v", len(recs), audited, ops)
	}
	if recs, err := fenceq.ListAudit(b.ctx, b.db.Pool, queue.AuditParams{JobID: held.ID}); err != nil || len(recs) != 1 {
		t.Fatalf("audit records of job %d: %+v, %v", held.ID, recs, err)
	}

	// A second cancel finds the same jobs, all finished now: skipped, not errors.
	res, err = fenceq.CancelJobs(ctx, b.db.Pool, queue.JobFilter{Kind: "op"}, nil)
	if err != nil || res.Matched != len(ops) || res.Skipped != len(ops) || len(res.Changed) != 0 {
		t.Fatalf("cancel finished jobs: %+v, %v", res, err)
	}

	// Retry only what was counted: UpToID leaves out the newer jobs.
	n, upTo, err := fenceq.CountMatching(b.ctx, b.db.Pool, queue.JobFilter{State: queue.StateCancelled}, 0, 0)
	if err != nil || n != len(ops) || upTo != ops[len(ops)-1] {
		t.Fatalf("count cancelled: %d up to %d, %v", n, upTo, err)
	}
	res, err = fenceq.RetryJobs(ctx, b.db.Pool, queue.JobFilter{State: queue.StateCancelled}, &fenceq.BulkOptions{UpToID: ops[2]})
	if err != nil || len(res.Changed) != 3 {
		t.Fatalf("retry the cancelled jobs up to %d: %+v, %v", ops[2], res, err)
	}
	res, err = fenceq.RetryJobs(ctx, b.db.Pool, queue.JobFilter{State: queue.StateCancelled}, nil)
	if err != nil || len(res.Changed) != 2 {
		t.Fatalf("retry the other cancelled jobs: %+v, %v", res, err)
	}
	// Selected jobs: by id.
	res, err = fenceq.DeleteJobs(ctx, b.db.Pool, queue.JobFilter{IDs: others}, nil)
	if err != nil || len(res.Changed) != len(others) {
		t.Fatalf("delete the other jobs by id: %+v, %v", res, err)
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
	// A bulk action that changes nothing is recorded once, with what it found.
	before, _ := fenceq.ListAudit(b.ctx, b.db.Pool, queue.AuditParams{Limit: 1})
	res, err = fenceq.DeleteJobs(ctx, b.db.Pool, queue.JobFilter{Kind: "nothing"}, nil)
	if err != nil || res.Matched != 0 {
		t.Fatalf("delete kind nothing: %+v, %v", res, err)
	}
	after, _ := fenceq.ListAudit(b.ctx, b.db.Pool, queue.AuditParams{Limit: 1})
	if len(after) != 1 || after[0].ID == before[0].ID || after[0].Action != queue.AuditDelete || len(after[0].JobIDs) != 0 {
		t.Fatalf("audit of a bulk action that changed nothing: %+v", after)
	}
}

// A job that changed after its batch listed it and no longer matches the filter is
// left alone: each batch locks its jobs and checks the filter again.
func TestBulkActionRechecksTheFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueueN(t, 3, func(i int) fenceq.JobArgs { return opArgs{N: i} })
	// Cancel the available jobs among all three ids: the one claimed meanwhile is
	// running and is not touched.
	held := b.claim(t, "holder")
	res, err := fenceq.CancelJobs(b.ctx, b.db.Pool, queue.JobFilter{IDs: ids, State: queue.StateAvailable}, nil)
	if err != nil || len(res.Changed) != 2 || slices.Contains(res.Changed, held.ID) {
		t.Fatalf("cancel available: %+v, %v", res, err)
	}
	if j, err := fenceq.GetJob(b.ctx, b.db.Pool, held.ID); err != nil || j.State != queue.StateRunning || j.LeaseGen != held.LeaseGen {
		t.Fatalf("the running job after a cancel of available jobs: %+v, %v", j, err)
	}
	recs, err := fenceq.ListAudit(b.ctx, b.db.Pool, queue.AuditParams{})
	if err != nil || len(recs) != 1 || recs[0].Actor != "api" || len(recs[0].JobIDs) != 2 {
		t.Fatalf("audit: %+v, %v", recs, err)
	}
}

// Every single-job and queue action writes its audit record with the action.
func TestOperatorActionsAreAudited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := fenceq.WithActor(b.ctx, "dashboard:alice")
	ids := b.enqueueN(t, 1, func(i int) fenceq.JobArgs { return opArgs{N: i} })
	if _, err := fenceq.CancelJob(ctx, b.db.Pool, ids[0], "no longer needed"); err != nil {
		t.Fatal(err)
	}
	// A refused action writes nothing.
	if _, err := fenceq.CancelJob(ctx, b.db.Pool, ids[0], ""); !errors.Is(err, queue.ErrWrongState) {
		t.Fatalf("cancel a cancelled job: %v", err)
	}
	if _, err := fenceq.RetryJob(ctx, b.db.Pool, ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := fenceq.PauseQueue(ctx, b.db.Pool, "mail"); err != nil {
		t.Fatal(err)
	}
	recs, err := fenceq.ListAudit(b.ctx, b.db.Pool, queue.AuditParams{})
	if err != nil {
		t.Fatal(err)
	}
	want := []queue.AuditAction{queue.AuditPauseQueue, queue.AuditRetry, queue.AuditCancel}
	if len(recs) != len(want) {
		t.Fatalf("%d audit records, want %d: %+v", len(recs), len(want), recs)
	}
	for i, r := range recs {
		if r.Action != want[i] || r.Actor != "dashboard:alice" {
			t.Fatalf("record %d: %+v, want %s by dashboard:alice", i, r, want[i])
		}
	}
	if !slices.Equal(recs[0].Names, []string{"mail"}) || !slices.Equal(recs[2].JobIDs, ids) || recs[2].Detail != "no longer needed" {
		t.Fatalf("records: %+v", recs)
	}
	// In the caller's transaction, a rollback takes the action and its record back.
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fenceq.CancelJob(ctx, tx, ids[0], ""); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if again, _ := fenceq.ListAudit(b.ctx, b.db.Pool, queue.AuditParams{}); len(again) != len(want) {
		t.Fatalf("after a rolled back cancel: %d records, want %d", len(again), len(want))
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
