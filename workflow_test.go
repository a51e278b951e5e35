package fenceq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// taskArgs are the args of the workflow tests' tasks: Name identifies the task, Fail
// makes its handler discard it.
type taskArgs struct {
	Name string `json:"name"`
	Fail bool   `json:"fail,omitempty"`
}

func (taskArgs) Kind() string { return "task" }

// flowBundle is setup with a handler for taskArgs that records each run, records the
// task's name and its dependencies' outputs as its output, and discards tasks whose
// name is in fail.
type flowBundle struct {
	*testBundle
	mu   sync.Mutex
	runs map[string]int
	fail sync.Map // task name → true: discard it
	deps map[string][]string
}

func setupFlow(t *testing.T) *flowBundle {
	t.Helper()
	fenceqtest.SkipOnCitus(t, "dependencies and workflows are refused on a Citus distributed schema")
	b := &flowBundle{testBundle: setup(t), runs: map[string]int{}, deps: map[string][]string{}}
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[taskArgs]) error {
		b.mu.Lock()
		b.runs[job.Args.Name]++
		deps := b.deps[job.Args.Name]
		b.mu.Unlock()
		if f, _ := b.fail.Load(job.Args.Name); f == true || job.Args.Fail {
			return fenceq.JobDiscard(errors.New("task " + job.Args.Name + " fails"))
		}
		out := []string{job.Args.Name}
		for _, d := range deps {
			var got []string
			if err := job.DependencyOutput(ctx, d, &got); err != nil {
				return fmt.Errorf("output of %s: %w", d, err)
			}
			out = append(out, got...)
		}
		return fenceq.RecordOutput(ctx, out)
	}, nil)
	return b
}

func (b *flowBundle) runsOf(name string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs[name]
}

// add adds task name to wf, noting the dependencies whose output the handler reads:
// those it does not tolerate (a tolerated one may have no output).
func (b *flowBundle) add(wf *fenceq.Workflow, name string, opts *fenceq.TaskOpts) {
	if opts == nil {
		opts = &fenceq.TaskOpts{}
	}
	b.mu.Lock()
	for _, d := range opts.After {
		if !slices.Contains(opts.Tolerate, d) {
			b.deps[name] = append(b.deps[name], d)
		}
	}
	b.mu.Unlock()
	wf.Add(name, taskArgs{Name: name}, opts)
}

// A diamond with a fan-out and a fan-in: every task starts after each of its
// dependencies completed, runs once, and reads their recorded outputs.
func TestWorkflowDAGOrderAndOutputs(t *testing.T) {
	t.Parallel()
	b := setupFlow(t)
	wf := fenceq.NewWorkflow("diamond")
	b.add(wf, "fetch", nil)
	b.add(wf, "left", &fenceq.TaskOpts{After: []string{"fetch"}})
	b.add(wf, "right", &fenceq.TaskOpts{After: []string{"fetch"}})
	b.add(wf, "join", &fenceq.TaskOpts{After: []string{"left", "right"}})
	res, err := wf.Enqueue(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]queue.State{"fetch": queue.StateAvailable, "left": queue.StatePending,
		"right": queue.StatePending, "join": queue.StatePending} {
		j, err := fenceq.GetJob(b.ctx, b.db.Pool, res.Jobs[name])
		if err != nil || j.State != want {
			t.Fatalf("task %s after enqueue: %v %v, want %s", name, j, err, want)
		}
	}
	cfg := b.fastConfig(5 * time.Second)
	b.startWorker(t, cfg)
	b.startWorker(t, cfg)
	jobs := map[string]*queue.JobRow{}
	for name, id := range res.Jobs {
		jobs[name] = fenceqtest.WaitState(t, b.db.Pool, id, queue.StateCompleted, 30*time.Second)
	}
	for name, deps := range map[string][]string{"left": {"fetch"}, "right": {"fetch"}, "join": {"left", "right"}} {
		for _, d := range deps {
			if !jobs[name].AttemptedAt.After(*jobs[d].FinishedAt) {
				t.Errorf("task %s started at %s, before its dependency %s finished at %s",
					name, jobs[name].AttemptedAt, d, jobs[d].FinishedAt)
			}
		}
	}
	for name := range res.Jobs {
		if n := b.runsOf(name); n != 1 {
			t.Errorf("task %s ran %d times, want once", name, n)
		}
	}
	if got := string(jobs["join"].Output); got != `["join", "left", "fetch", "right", "fetch"]` {
		t.Errorf("join's output = %s, want its own name and its dependencies' outputs", got)
	}
	w, err := fenceq.GetWorkflow(b.ctx, b.db.Pool, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "diamond" || len(w.Tasks) != 4 || w.States[queue.StateCompleted] != 4 || !w.Finished() {
		t.Fatalf("workflow = %+v, want 4 completed tasks", w)
	}
	for _, task := range w.Tasks {
		if task.Name == "join" && (len(task.DependsOn) != 2 || !task.DependsOn[0].Done || task.DependsOn[0].Task != "left") {
			t.Errorf("join's dependencies = %+v", task.DependsOn)
		}
	}
	if id, err := fenceq.WorkflowOfJob(b.ctx, b.db.Pool, res.Jobs["join"]); err != nil || id != res.ID {
		t.Errorf("WorkflowOfJob = %d %v, want %d", id, err, res.ID)
	}
}

// A discarded task cancels its dependents, transitively, except a dependent that
// tolerates it, which runs. An operator's retry of the failed task brings the cancelled
// dependents back to pending; they run once it completes.
func TestWorkflowCancellationToleranceAndRetry(t *testing.T) {
	t.Parallel()
	b := setupFlow(t)
	b.fail.Store("charge", true)
	wf := fenceq.NewWorkflow("order")
	b.add(wf, "charge", &fenceq.TaskOpts{InsertOpts: fenceq.InsertOpts{MaxAttempts: 1}})
	b.add(wf, "ship", &fenceq.TaskOpts{After: []string{"charge"}})
	b.add(wf, "email", &fenceq.TaskOpts{After: []string{"ship"}})
	b.add(wf, "audit", &fenceq.TaskOpts{After: []string{"charge"}, Tolerate: []string{"charge"}})
	res, err := wf.Enqueue(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	b.startWorker(t, b.fastConfig(5*time.Second))
	fenceqtest.WaitState(t, b.db.Pool, res.Jobs["charge"], queue.StateDiscarded, 30*time.Second)
	fenceqtest.WaitState(t, b.db.Pool, res.Jobs["audit"], queue.StateCompleted, 30*time.Second)
	ship := fenceqtest.WaitState(t, b.db.Pool, res.Jobs["ship"], queue.StateCancelled, 30*time.Second)
	email := fenceqtest.WaitState(t, b.db.Pool, res.Jobs["email"], queue.StateCancelled, 30*time.Second)
	if b.runsOf("ship") != 0 || b.runsOf("email") != 0 {
		t.Fatalf("cancelled dependents ran: ship %d, email %d", b.runsOf("ship"), b.runsOf("email"))
	}
	if len(ship.Errors) != 1 || !strings.Contains(ship.Errors[0].Error, fmt.Sprintf("dependency %d was discarded", res.Jobs["charge"])) {
		t.Errorf("ship's errors = %+v, want the dependency that cancelled it", ship.Errors)
	}
	if len(email.Errors) != 1 || !strings.Contains(email.Errors[0].Error, fmt.Sprintf("dependency %d was cancelled", res.Jobs["ship"])) {
		t.Errorf("email's errors = %+v, want the dependency that cancelled it", email.Errors)
	}
	w, err := fenceq.GetWorkflow(b.ctx, b.db.Pool, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range w.Tasks {
		if task.Name == "ship" && task.BlockedBy != res.Jobs["charge"] {
			t.Errorf("ship blocked by %d, want charge %d", task.BlockedBy, res.Jobs["charge"])
		}
	}

	// The operator fixes the cause and retries the failed task: its dependents come back.
	b.fail.Store("charge", false)
	if _, err := fenceq.RetryJob(b.ctx, b.db.Pool, res.Jobs["charge"]); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"charge", "ship", "email"} {
		fenceqtest.WaitState(t, b.db.Pool, res.Jobs[name], queue.StateCompleted, 30*time.Second)
	}
	for name, want := range map[string]int{"charge": 2, "ship": 1, "email": 1, "audit": 1} {
		if n := b.runsOf(name); n != want {
			t.Errorf("task %s ran %d times, want %d", name, n, want)
		}
	}
}

// Retrying a dependency brings back a dependent it cancelled only while no other of the
// dependent's dependencies has failed: then the dependent stays cancelled in that one's
// name, and comes back when it is retried too.
func TestWorkflowRetryWithTwoFailedDependencies(t *testing.T) {
	t.Parallel()
	b := setupFlow(t)
	wf := fenceq.NewWorkflow("two")
	b.add(wf, "a", nil)
	b.add(wf, "b", nil)
	b.add(wf, "c", &fenceq.TaskOpts{After: []string{"a", "b"}})
	res, err := wf.Enqueue(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	// Both dependencies are cancelled by an operator before they run.
	for _, name := range []string{"a", "b"} {
		if _, err := fenceq.CancelJob(b.ctx, b.db.Pool, res.Jobs[name], "no"); err != nil {
			t.Fatal(err)
		}
	}
	state := func(name string) queue.State {
		j, err := fenceq.GetJob(b.ctx, b.db.Pool, res.Jobs[name])
		if err != nil {
			t.Fatal(err)
		}
		return j.State
	}
	if s := state("c"); s != queue.StateCancelled {
		t.Fatalf("c = %s, want cancelled", s)
	}
	if _, err := fenceq.RetryJob(b.ctx, b.db.Pool, res.Jobs["a"]); err != nil {
		t.Fatal(err)
	}
	if s := state("c"); s != queue.StateCancelled {
		t.Fatalf("c after retrying a while b is cancelled = %s, want cancelled", s)
	}
	if _, err := fenceq.RetryJob(b.ctx, b.db.Pool, res.Jobs["b"]); err != nil {
		t.Fatal(err)
	}
	if s := state("c"); s != queue.StatePending {
		t.Fatalf("c after retrying both = %s, want pending", s)
	}
	b.startWorker(t, b.fastConfig(5*time.Second))
	fenceqtest.WaitState(t, b.db.Pool, res.Jobs["c"], queue.StateCompleted, 30*time.Second)
}

// Bad workflows are refused with an error naming the task, and nothing is written.
func TestWorkflowValidation(t *testing.T) {
	t.Parallel()
	b := setupFlow(t)
	cases := []struct {
		name string
		wf   func() *fenceq.Workflow
		want string
	}{
		{"UnknownDependency", func() *fenceq.Workflow {
			return fenceq.NewWorkflow("w").Add("a", taskArgs{}, nil).Add("b", taskArgs{}, &fenceq.TaskOpts{After: []string{"nope"}})
		}, `task b: invalid after: no task named "nope"`},
		{"Cycle", func() *fenceq.Workflow {
			return fenceq.NewWorkflow("w").Add("a", taskArgs{}, &fenceq.TaskOpts{After: []string{"c"}}).
				Add("b", taskArgs{}, &fenceq.TaskOpts{After: []string{"a"}}).
				Add("c", taskArgs{}, &fenceq.TaskOpts{After: []string{"b"}}).Add("d", taskArgs{}, nil)
		}, "the tasks a → c → b → a form a cycle"},
		{"Duplicate", func() *fenceq.Workflow {
			return fenceq.NewWorkflow("w").Add("a", taskArgs{}, nil).Add("a", taskArgs{}, nil)
		}, "task a is added twice"},
		{"SelfDependency", func() *fenceq.Workflow {
			return fenceq.NewWorkflow("w").Add("a", taskArgs{}, &fenceq.TaskOpts{After: []string{"a"}})
		}, "task a: invalid after: a task cannot run after itself"},
		{"TolerateNotAfter", func() *fenceq.Workflow {
			return fenceq.NewWorkflow("w").Add("a", taskArgs{}, nil).Add("b", taskArgs{}, &fenceq.TaskOpts{Tolerate: []string{"a"}})
		}, `task b: invalid tolerate: "a" is not among its After`},
		{"BadTaskName", func() *fenceq.Workflow {
			return fenceq.NewWorkflow("w").Add("a b", taskArgs{}, nil)
		}, "task 1: invalid name"},
		{"BadInsertOpts", func() *fenceq.Workflow {
			return fenceq.NewWorkflow("w").Add("a", taskArgs{}, &fenceq.TaskOpts{InsertOpts: fenceq.InsertOpts{MaxAttempts: -1}})
		}, "task a: invalid max_attempts"},
		{"Empty", func() *fenceq.Workflow { return fenceq.NewWorkflow("w") }, "invalid tasks: none added"},
		{"MissingJob", func() *fenceq.Workflow {
			return fenceq.NewWorkflow("w").Add("a", taskArgs{}, nil).Add("b", taskArgs{}, &fenceq.TaskOpts{AfterJobs: []int64{999999}})
		}, "dependency 999999 of job"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.wf().Enqueue(b.ctx, b.db.Pool)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Enqueue: %v, want an error containing %q", err, c.want)
			}
			if c.name != "MissingJob" && !errors.Is(err, queue.ErrInvalid) {
				t.Errorf("error %v does not match queue.ErrInvalid", err)
			}
			if c.name == "MissingJob" && !errors.Is(err, queue.ErrNotFound) {
				t.Errorf("error %v does not match queue.ErrNotFound", err)
			}
		})
	}
	var jobs, wfs int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM fenceq_jobs), (SELECT count(*) FROM fenceq_workflows)`).
		Scan(&jobs, &wfs); err != nil {
		t.Fatal(err)
	}
	if jobs != 0 || wfs != 0 {
		t.Fatalf("refused workflows wrote %d jobs and %d workflows, want none", jobs, wfs)
	}
}

// A job may depend on existing jobs by id: one already completed counts as done, one
// already discarded cancels it unless tolerated, one unfinished keeps it pending.
func TestEnqueueAfterExistingJobs(t *testing.T) {
	t.Parallel()
	b := setupFlow(t)
	ctx, pool := b.ctx, b.db.Pool
	enq := func(name string) int64 {
		res, err := fenceq.Enqueue(ctx, pool, taskArgs{Name: name}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Job.ID
	}
	done, failed, open := enq("done"), enq("failed"), enq("open")
	if _, err := b.db.Pool.Exec(ctx, `UPDATE fenceq_jobs SET state = 'completed', finished_at = now() WHERE id = $1`, done); err != nil {
		t.Fatal(err)
	}
	if _, err := fenceq.CancelJob(ctx, pool, failed, "gone"); err != nil {
		t.Fatal(err)
	}
	after := func(deps []int64, tolerate []int64) queue.State {
		t.Helper()
		res, err := fenceq.EnqueueAfter(ctx, pool, taskArgs{Name: "after"}, &fenceq.TaskOpts{AfterJobs: deps, TolerateJobs: tolerate})
		if err != nil {
			t.Fatal(err)
		}
		j, err := fenceq.GetJob(ctx, pool, res.Job.ID)
		if err != nil {
			t.Fatal(err)
		}
		if j.State != res.Job.State {
			t.Errorf("EnqueueAfter returned state %s, the job is %s", res.Job.State, j.State)
		}
		return j.State
	}
	if s := after([]int64{done}, nil); s != queue.StateAvailable {
		t.Errorf("after a completed job: %s, want available", s)
	}
	if s := after([]int64{done, failed}, nil); s != queue.StateCancelled {
		t.Errorf("after a cancelled job: %s, want cancelled", s)
	}
	if s := after([]int64{done, failed}, []int64{failed}); s != queue.StateAvailable {
		t.Errorf("after a tolerated cancelled job: %s, want available", s)
	}
	if s := after([]int64{done, open}, nil); s != queue.StatePending {
		t.Errorf("after an unfinished job: %s, want pending", s)
	}
	if _, err := fenceq.EnqueueAfter(ctx, pool, taskArgs{}, &fenceq.TaskOpts{}); !errors.Is(err, queue.ErrInvalid) {
		t.Errorf("EnqueueAfter without dependencies: %v, want ErrInvalid", err)
	}
}

// Two dependencies of one task completed at the same instant by two transactions: the
// counter's row lock lets exactly one of them release the task, every time.
func TestDependenciesFinishingAtOnceReleaseOnce(t *testing.T) {
	t.Parallel()
	b := setupFlow(t)
	for i := range 30 {
		wf := fenceq.NewWorkflow("race")
		wf.Add("a", taskArgs{Name: "a"}, nil).Add("b", taskArgs{Name: "b"}, nil).
			Add("c", taskArgs{Name: "c"}, &fenceq.TaskOpts{After: []string{"a", "b"}})
		res, err := wf.Enqueue(b.ctx, b.db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		leases := claimAll(t, b.testBundle, 2)
		completeAtOnce(t, b.testBundle, leases)
		c, err := fenceq.GetJob(b.ctx, b.db.Pool, res.Jobs["c"])
		if err != nil {
			t.Fatal(err)
		}
		if c.State != queue.StateAvailable {
			t.Fatalf("iteration %d: c = %s after both dependencies completed at once, want available", i, c.State)
		}
		// Run c out of the way of the next iteration's claims.
		if _, err := fenceq.CancelJob(b.ctx, b.db.Pool, c.ID, "done"); err != nil {
			t.Fatal(err)
		}
	}
}

// claimAll claims n available jobs of the default queue, failing unless exactly n came.
func claimAll(t *testing.T, b *testBundle, n int) []queue.Lease {
	t.Helper()
	rows, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: queue.DefaultQueue, WorkerID: "test", Limit: n + 1, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != n {
		t.Fatalf("claimed %d jobs, want %d", len(rows), n)
	}
	ls := make([]queue.Lease, n)
	for i, r := range rows {
		ls[i] = store.LeaseOf(r)
	}
	return ls
}

// completeAtOnce completes each lease in a transaction of its own, all started before
// any commits, so that the finishing statements and their triggers run concurrently.
// A lease with a negative job id is discarded instead (its id negated).
func completeAtOnce(t *testing.T, b *testBundle, leases []queue.Lease) {
	t.Helper()
	var ready, wg sync.WaitGroup
	ready.Add(len(leases))
	start := make(chan struct{})
	errs := make(chan error, len(leases))
	var done atomic.Int64
	for _, l := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := b.db.Pool.Acquire(b.ctx)
			if err != nil {
				ready.Done()
				errs <- err
				return
			}
			defer conn.Release()
			ready.Done()
			<-start
			if l.JobID < 0 {
				l.JobID = -l.JobID
				_, err = store.Fail(b.ctx, conn, l, store.FailParams{Err: "boom", Discard: true})
			} else {
				err = store.Complete(b.ctx, conn, l)
			}
			if err != nil {
				errs <- err
				return
			}
			done.Add(1)
		}()
	}
	ready.Wait()
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if done.Load() != int64(len(leases)) {
		t.Fatalf("%d of %d finished", done.Load(), len(leases))
	}
}
