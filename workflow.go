package fenceq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// ErrNoOutput is returned by Job.DependencyOutput for a task that completed without
// recording an output.
var ErrNoOutput = errors.New("no output recorded")

// Workflow is a set of named tasks, each a job, with dependencies between them (a
// directed acyclic graph: fan-out and fan-in), enqueued together in one transaction by
// Enqueue. A task with dependencies waits as pending and becomes available only when
// every one of them has completed; the database decides that in the transaction that
// completes the last one, whichever worker completes it. A dependency that is discarded
// or cancelled cancels its dependents, transitively, unless they tolerate it; an
// operator's retry of it brings them back (see docs/flow.md).
type Workflow struct {
	name  string
	tasks []*workflowTask
	err   error
}

type workflowTask struct {
	name string
	args JobArgs
	opts TaskOpts
}

// TaskOpts are the options of one task: its insert options and its dependencies.
type TaskOpts struct {
	// InsertOpts are the job's insert options. A task's unique key must not be held by
	// another job: Enqueue fails rather than join that job to the workflow.
	InsertOpts
	// After names the tasks of the same workflow this task runs after.
	After []string
	// Tolerate names those tasks of After whose discard or cancel counts as done for
	// this task, instead of cancelling it.
	Tolerate []string
	// AfterJobs are existing jobs (by id) this task runs after; one already completed
	// counts as done.
	AfterJobs []int64
	// TolerateJobs are those jobs of AfterJobs whose discard or cancel counts as done.
	TolerateJobs []int64
}

// WorkflowResult is what Workflow.Enqueue inserted.
type WorkflowResult struct {
	// ID is the workflow's id (fenceq_workflows; GetWorkflow).
	ID int64
	// Jobs are the tasks' job ids by task name.
	Jobs map[string]int64
}

// NewWorkflow starts a workflow named name (1–128 letters, digits and "_ . : -"; names
// need not be unique).
func NewWorkflow(name string) *Workflow {
	w := &Workflow{name: name}
	if err := queue.ValidateName("name", name, 128); err != nil {
		w.err = fmt.Errorf("workflow: %w", err)
	}
	return w
}

// Add adds a task named name (1–128 letters, digits and "_ . : -", unique in the
// workflow) that runs args with opts (nil for none), and returns the workflow. Errors
// in the task are reported by Enqueue.
func (w *Workflow) Add(name string, args JobArgs, opts *TaskOpts) *Workflow {
	t := &workflowTask{name: name, args: args}
	if opts != nil {
		t.opts = *opts
	}
	w.tasks = append(w.tasks, t)
	return w
}

// validate checks the workflow's names and graph without touching the database, and
// returns its tasks in an order in which every task comes after its dependencies (the
// order of Add where the dependencies allow).
func (w *Workflow) validate() ([]*workflowTask, error) {
	if w.err != nil {
		return nil, w.err
	}
	if len(w.tasks) == 0 {
		return nil, fmt.Errorf("workflow %s: %w", w.name, &queue.ValidationError{Field: "tasks", Reason: "none added"})
	}
	by := make(map[string]*workflowTask, len(w.tasks))
	for i, t := range w.tasks {
		if err := queue.ValidateName("name", t.name, 128); err != nil {
			return nil, fmt.Errorf("workflow %s: task %d: %w", w.name, i+1, err)
		}
		if by[t.name] != nil {
			return nil, fmt.Errorf("workflow %s: %w", w.name,
				&queue.ValidationError{Field: "name", Reason: fmt.Sprintf("task %s is added twice", t.name)})
		}
		by[t.name] = t
	}
	for _, t := range w.tasks {
		for _, d := range t.opts.After {
			if by[d] == nil {
				return nil, fmt.Errorf("workflow %s: task %s: %w", w.name, t.name,
					&queue.ValidationError{Field: "after", Reason: fmt.Sprintf("no task named %q in the workflow", d)})
			}
			if d == t.name {
				return nil, fmt.Errorf("workflow %s: task %s: %w", w.name, t.name,
					&queue.ValidationError{Field: "after", Reason: "a task cannot run after itself"})
			}
		}
		for _, d := range t.opts.Tolerate {
			if !slices.Contains(t.opts.After, d) {
				return nil, fmt.Errorf("workflow %s: task %s: %w", w.name, t.name,
					&queue.ValidationError{Field: "tolerate", Reason: fmt.Sprintf("%q is not among its After", d)})
			}
		}
		for _, id := range t.opts.TolerateJobs {
			if !slices.Contains(t.opts.AfterJobs, id) {
				return nil, fmt.Errorf("workflow %s: task %s: %w", w.name, t.name,
					&queue.ValidationError{Field: "tolerate_jobs", Reason: fmt.Sprintf("job %d is not among its AfterJobs", id)})
			}
		}
		for _, id := range t.opts.AfterJobs {
			if id <= 0 {
				return nil, fmt.Errorf("workflow %s: task %s: %w", w.name, t.name,
					&queue.ValidationError{Field: "after_jobs", Reason: fmt.Sprintf("%d is not a job id", id)})
			}
		}
		if err := ValidateEnqueue(t.args, &t.opts.InsertOpts); err != nil {
			return nil, fmt.Errorf("workflow %s: task %s: %w", w.name, t.name, err)
		}
	}
	// Kahn's order, taking at each step the first task in Add order whose dependencies
	// are placed.
	placed := make(map[string]bool, len(w.tasks))
	order := make([]*workflowTask, 0, len(w.tasks))
	for len(order) < len(w.tasks) {
		progress := false
		for _, t := range w.tasks {
			if placed[t.name] || !allPlaced(t.opts.After, placed) {
				continue
			}
			placed[t.name] = true
			order = append(order, t)
			progress = true
		}
		if !progress {
			return nil, fmt.Errorf("workflow %s: %w", w.name,
				&queue.ValidationError{Field: "after", Reason: "the tasks " + cycleOf(w.tasks, by, placed) + " form a cycle"})
		}
	}
	return order, nil
}

func allPlaced(names []string, placed map[string]bool) bool {
	for _, n := range names {
		if !placed[n] {
			return false
		}
	}
	return true
}

// cycleOf names one cycle among the tasks not placed: every one of them has a
// dependency not placed, so walking such dependencies must come back to a task seen.
func cycleOf(tasks []*workflowTask, by map[string]*workflowTask, placed map[string]bool) string {
	var t *workflowTask
	for _, c := range tasks {
		if !placed[c.name] {
			t = c
			break
		}
	}
	seen := map[string]int{}
	var path []string
	for {
		if i, ok := seen[t.name]; ok {
			return strings.Join(append(path[i:], t.name), " → ")
		}
		seen[t.name] = len(path)
		path = append(path, t.name)
		for _, d := range t.opts.After {
			if !placed[d] {
				t = by[d]
				break
			}
		}
	}
}

// Enqueue validates the workflow and inserts every task in one transaction (a savepoint
// when db is a pgx.Tx, so that the workflow commits with the caller's transaction): the
// tasks without dependencies available (or scheduled), the others pending. Nothing is
// written when it returns an error; a validation error names the task and matches
// queue.ErrInvalid. Tasks go through the insert middleware of the Inserter ctx carries,
// as Enqueue's jobs do. It fails on a Citus distributed schema, which has no workflows.
func (w *Workflow) Enqueue(ctx context.Context, db queue.Beginner) (*WorkflowResult, error) {
	order, err := w.validate()
	if err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("enqueue workflow %s: begin: %w", w.name, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	id, err := store.CreateWorkflow(ctx, tx, w.name, queue.WorkflowKindWorkflow)
	if err != nil {
		return nil, err
	}
	res := &WorkflowResult{ID: id, Jobs: make(map[string]int64, len(order))}
	for _, t := range order {
		ins, err := Enqueue(ctx, tx, t.args, &t.opts.InsertOpts)
		if err != nil {
			return nil, fmt.Errorf("enqueue workflow %s: task %s: %w", w.name, t.name, err)
		}
		if ins.Existing {
			return nil, fmt.Errorf("enqueue workflow %s: task %s: its unique key is held by job %d; a workflow's tasks must be new jobs: %w",
				w.name, t.name, ins.Job.ID, queue.ErrWrongState)
		}
		l := store.Link{Workflow: id, Task: t.name, Deps: slices.Clone(t.opts.AfterJobs), Tolerate: slices.Clone(t.opts.TolerateJobs)}
		for _, d := range t.opts.After {
			l.Deps = append(l.Deps, res.Jobs[d])
		}
		for _, d := range t.opts.Tolerate {
			l.Tolerate = append(l.Tolerate, res.Jobs[d])
		}
		if _, err := store.LinkJob(ctx, tx, ins.Job.ID, l); err != nil {
			return nil, fmt.Errorf("enqueue workflow %s: task %s: %w", w.name, t.name, err)
		}
		res.Jobs[t.name] = ins.Job.ID
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("enqueue workflow %s: commit: %w", w.name, err)
	}
	return res, nil
}

// EnqueueAfter inserts one job that runs after the jobs opts.AfterJobs (by id), in one
// transaction (a savepoint when db is a pgx.Tx): pending until each of them completed,
// or at once when all already have. A dependency discarded or cancelled, and not in
// opts.TolerateJobs, cancels the job (an operator's retry of that dependency brings it
// back). opts.After and opts.Tolerate name workflow tasks and must be empty here. The
// row returned is the job as inserted; read it again for its state after the link.
func EnqueueAfter(ctx context.Context, db queue.Beginner, args JobArgs, opts *TaskOpts) (*queue.InsertResult, error) {
	var o TaskOpts
	if opts != nil {
		o = *opts
	}
	if len(o.After) > 0 || len(o.Tolerate) > 0 {
		return nil, &queue.ValidationError{Field: "after", Reason: "names workflow tasks; use AfterJobs for jobs by id"}
	}
	if len(o.AfterJobs) == 0 {
		return nil, &queue.ValidationError{Field: "after_jobs", Reason: "is empty; use Enqueue for a job without dependencies"}
	}
	for _, id := range o.TolerateJobs {
		if !slices.Contains(o.AfterJobs, id) {
			return nil, &queue.ValidationError{Field: "tolerate_jobs", Reason: fmt.Sprintf("job %d is not among AfterJobs", id)}
		}
	}
	if err := ValidateEnqueue(args, &o.InsertOpts); err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("enqueue %s after jobs: begin: %w", args.Kind(), err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ins, err := Enqueue(ctx, tx, args, &o.InsertOpts)
	if err != nil {
		return nil, err
	}
	if ins.Existing {
		return nil, fmt.Errorf("enqueue %s after jobs: its unique key is held by job %d: %w", args.Kind(), ins.Job.ID, queue.ErrWrongState)
	}
	st, err := store.LinkJob(ctx, tx, ins.Job.ID, store.Link{Deps: o.AfterJobs, Tolerate: o.TolerateJobs})
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("enqueue %s after jobs: commit: %w", args.Kind(), err)
	}
	ins.Job.State = st
	return ins, nil
}

// GetWorkflow returns a workflow (or batch) with its tasks, their states and their
// dependencies; queue.ErrNotFound when there is none.
func GetWorkflow(ctx context.Context, db queue.DBTX, id int64) (*queue.Workflow, error) {
	return store.GetWorkflow(ctx, db, id)
}

// ListWorkflows returns the newest workflows and batches matching p, with their tasks'
// counts by state.
func ListWorkflows(ctx context.Context, db queue.DBTX, p queue.WorkflowListParams) ([]*queue.Workflow, error) {
	return store.ListWorkflows(ctx, db, p)
}

// WorkflowOfJob returns the id of the workflow or batch job id belongs to, or 0.
func WorkflowOfJob(ctx context.Context, db queue.DBTX, id int64) (int64, error) {
	return store.WorkflowOf(ctx, db, id)
}

// DependencyOutput decodes into v the output recorded by task (a task of the same
// workflow, typically one this job runs after) when it completed. It returns an error
// matching queue.ErrNotFound when the job is in no workflow or the workflow has no such
// task, queue.ErrWrongState when the task has not completed, and ErrNoOutput when it
// completed without recording an output.
func (j *Job[T]) DependencyOutput(ctx context.Context, task string, v any) error {
	st, out, err := store.DependencyOutput(ctx, j.exec.w.pool, j.ID, task)
	if err != nil {
		return err
	}
	if st != queue.StateCompleted {
		return fmt.Errorf("output of task %q: it is %s: %w", task, st, queue.ErrWrongState)
	}
	if out == nil {
		return fmt.Errorf("output of task %q: %w", task, ErrNoOutput)
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("decode output of task %q: %w", task, err)
	}
	return nil
}
