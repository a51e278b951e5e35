package fenceq

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// Batch is a group of jobs with a callback job that becomes available exactly once,
// when the last of them has finished, whatever its final state (completed, discarded
// or cancelled), with the counts of each recorded in its metadata (BatchOutcome). The
// callback is inserted with the batch, pending, and waits for every member as a
// dependency that it tolerates; the member that finishes last releases it in its own
// finishing transaction, decided under a row lock, so that two members finishing at
// the same instant on two workers release it once.
type Batch struct {
	name     string
	callback JobArgs
	cbOpts   InsertOpts
	items    []EnqueueItem
}

// BatchResult is what Batch.Enqueue inserted.
type BatchResult struct {
	// ID is the batch's id (a workflow of kind batch: GetWorkflow).
	ID int64
	// CallbackID is the callback job's id.
	CallbackID int64
	// JobIDs are the members' ids, in the order they were added.
	JobIDs []int64
}

// NewBatch starts a batch named name whose callback job runs callback with opts (nil
// for none).
func NewBatch(name string, callback JobArgs, opts *InsertOpts) *Batch {
	b := &Batch{name: name, callback: callback}
	if opts != nil {
		b.cbOpts = *opts
	}
	return b
}

// Add adds a member job and returns the batch.
func (b *Batch) Add(args JobArgs, opts *InsertOpts) *Batch {
	b.items = append(b.items, EnqueueItem{Args: args, Opts: opts})
	return b
}

// Enqueue inserts the members and the callback in one transaction (a savepoint when db
// is a pgx.Tx): nothing is written when it returns an error, and no member can finish
// before the whole batch has committed. A member's unique key must not be held by
// another job.
func (b *Batch) Enqueue(ctx context.Context, db queue.Beginner) (*BatchResult, error) {
	if err := queue.ValidateName("name", b.name, 128); err != nil {
		return nil, fmt.Errorf("batch: %w", err)
	}
	if len(b.items) == 0 {
		return nil, fmt.Errorf("batch %s: %w", b.name, &queue.ValidationError{Field: "jobs", Reason: "none added"})
	}
	if err := ValidateEnqueue(b.callback, &b.cbOpts); err != nil {
		return nil, fmt.Errorf("batch %s: callback: %w", b.name, err)
	}
	for i, it := range b.items {
		if err := ValidateEnqueue(it.Args, it.Opts); err != nil {
			return nil, fmt.Errorf("batch %s: job %d: %w", b.name, i+1, err)
		}
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("enqueue batch %s: begin: %w", b.name, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	id, err := store.CreateWorkflow(ctx, tx, b.name, queue.WorkflowKindBatch)
	if err != nil {
		return nil, err
	}
	res := &BatchResult{ID: id, JobIDs: make([]int64, len(b.items))}
	for i, it := range b.items {
		ins, err := Enqueue(ctx, tx, it.Args, it.Opts)
		if err != nil {
			return nil, fmt.Errorf("enqueue batch %s: job %d: %w", b.name, i+1, err)
		}
		if ins.Existing {
			return nil, fmt.Errorf("enqueue batch %s: job %d: its unique key is held by job %d; a batch's jobs must be new: %w",
				b.name, i+1, ins.Job.ID, queue.ErrWrongState)
		}
		if _, err := store.LinkJob(ctx, tx, ins.Job.ID, store.Link{Workflow: id}); err != nil {
			return nil, fmt.Errorf("enqueue batch %s: job %d: %w", b.name, i+1, err)
		}
		res.JobIDs[i] = ins.Job.ID
	}
	cb, err := Enqueue(ctx, tx, b.callback, &b.cbOpts)
	if err != nil {
		return nil, fmt.Errorf("enqueue batch %s: callback: %w", b.name, err)
	}
	if cb.Existing {
		return nil, fmt.Errorf("enqueue batch %s: callback: its unique key is held by job %d: %w", b.name, cb.Job.ID, queue.ErrWrongState)
	}
	if _, err := store.LinkJob(ctx, tx, cb.Job.ID, store.Link{Workflow: id, Task: "callback", Deps: res.JobIDs,
		Tolerate: res.JobIDs, DepCounts: true}); err != nil {
		return nil, fmt.Errorf("enqueue batch %s: callback: %w", b.name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("enqueue batch %s: commit: %w", b.name, err)
	}
	res.CallbackID = cb.Job.ID
	return res, nil
}

// BatchOutcome returns the counts a batch's callback job carries in its metadata (set
// when the batch's last job finished), and false for a job that carries none.
func BatchOutcome(job *queue.JobRow) (queue.BatchCounts, bool) {
	var m struct {
		Batch *queue.BatchCounts `json:"batch"`
	}
	if len(job.Metadata) == 0 || json.Unmarshal(job.Metadata, &m) != nil || m.Batch == nil {
		return queue.BatchCounts{}, false
	}
	return *m.Batch, true
}
