package fenceq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// RunResult is the outcome of Worker.RunJob.
type RunResult struct {
	// Job is the job's row once its outcome was written.
	Job *queue.JobRow
	// HandlerErr is what the handler returned: nil on success, a *PanicError when it
	// panicked, the error behind a retry, snooze, cancel or discard otherwise.
	HandlerErr error
}

// ErrNotClaimable is returned by RunJob for a job that is not available to claim now:
// scheduled for later, running, finished, or in a paused queue.
var ErrNotClaimable = errors.New("job is not available to claim now")

// RunJob claims one available job by its id and runs it at once, on the calling
// goroutine, exactly as a started worker runs a job it claimed: a real lease (the
// generation grows, leased_by is the worker's ID), the handler its Config.Handlers
// registers for the job's kind with its middleware and hooks, Job.Commit and
// Job.WithLease fenced, the lease heartbeated while the handler runs, and the outcome
// written with the worker's own fenced writes (completion, failure with backoff, snooze,
// cancel or discard). Config.Queues is not consulted: the job is claimed from its own
// queue, unless that queue is paused.
//
// It serves tests (package fenceqtest builds on it) and tools that run one job by hand.
// The worker must be new: never started and never used by RunJob before, since its
// execution machinery then serves this one job; afterwards it is stopped. RunJob fails
// with ErrNotClaimable for a job that is not available now, queue.ErrNotFound for no job,
// and an error naming the kind for a kind with no handler; the returned error is about
// running the job, never the handler's, which is RunResult.HandlerErr.
func (w *Worker) RunJob(ctx context.Context, jobID int64) (*RunResult, error) {
	job, err := store.GetJob(ctx, w.pool, jobID)
	if err != nil {
		return nil, fmt.Errorf("run job %d: %w", jobID, err)
	}
	if !slices.Contains(w.kinds, job.Kind) {
		return nil, fmt.Errorf("run job %d: no handler for kind %q in Config.Handlers", jobID, job.Kind)
	}
	if job.State != queue.StateAvailable {
		return nil, fmt.Errorf("run job %d (%s): it is %s (run at %s): %w", jobID, job.Kind, job.State,
			job.RunAt.Format(time.RFC3339Nano), ErrNotClaimable)
	}
	row, sent, err := w.claimOne(ctx, job)
	if err != nil {
		return nil, err
	}
	handlerErr, err := w.runClaimed(ctx, row, sent)
	if err != nil {
		return nil, err
	}
	after, err := store.GetJob(ctx, w.pool, jobID)
	if err != nil {
		return nil, fmt.Errorf("run job %d: read the job after its attempt: %w", jobID, err)
	}
	return &RunResult{Job: after, HandlerErr: handlerErr}, nil
}

// claimOne claims job, and only it, with the worker's own claim: from the job's queue,
// one job, starting just before the job's position in claim order (priority, run_at,
// id), so that no job of the queue ahead of it is taken instead. The claim runs in a
// transaction that commits only if it took this job. It returns the claimed row and the
// monotonic time the claim was sent, from which the worker's local lease deadline runs.
func (w *Worker) claimOne(ctx context.Context, job *queue.JobRow) (*queue.JobRow, time.Time, error) {
	var row *queue.JobRow
	sent := time.Now()
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		rows, err := store.Claim(ctx, tx, store.ClaimParams{Queue: job.Queue, WorkerID: w.cfg.ID, Limit: 1,
			Lease: w.cfg.LeaseDuration,
			After: &store.ClaimCursor{Priority: job.Priority, RunAt: job.RunAt, ID: job.ID - 1}})
		if err != nil {
			return err
		}
		if len(rows) != 1 || rows[0].ID != job.ID {
			return fmt.Errorf("its queue %q may be paused, or another worker holds it: %w", job.Queue, ErrNotClaimable)
		}
		row = rows[0]
		return nil
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("run job %d (%s): claim: %w", job.ID, job.Kind, err)
	}
	return row, sent, nil
}

// runClaimed runs one job that was claimed under a lease, synchronously, as one of the
// worker's execution goroutines would. The worker must be fresh (never started): its
// execution is the only one it tracks.
func (w *Worker) runClaimed(ctx context.Context, row *queue.JobRow, sent time.Time) (handlerErr, err error) {
	w.mu.Lock()
	fresh := w.state == stateNew && len(w.execs) == 0
	if fresh {
		w.state = stateStarted
	}
	w.mu.Unlock()
	if !fresh {
		return nil, fmt.Errorf("run claimed job %d: worker %s was started or runs a job already", row.ID, w.cfg.ID)
	}
	defer func() {
		w.mu.Lock()
		w.state = stateStopped
		w.mu.Unlock()
	}()
	if err := w.register(ctx); err != nil {
		return nil, fmt.Errorf("run claimed job %d: register worker %s: %w", row.ID, w.cfg.ID, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), w.cfg.WriteTimeout)
		defer cancel()
		if derr := store.DeregisterWorker(dctx, w.pool, w.cfg.ID); derr != nil {
			err = errors.Join(err, fmt.Errorf("deregister worker %s: %w", w.cfg.ID, derr))
		}
	}()

	hbCtx, stopHeartbeat := context.WithCancel(context.Background())
	w.bgWG.Add(1)
	go w.runHeartbeat(hbCtx)
	defer func() {
		stopHeartbeat()
		w.bgWG.Wait()
	}()

	e := w.newExecution(ctx, row, sent)
	trace, cause, handlerErr := e.call()
	e.settle(handlerErr, trace, cause)
	// A success queued its completion for the completer's next batch: write that batch.
	select {
	case c := <-w.complete:
		w.flushCompletions([]*execution{c})
	default:
	}
	w.execWG.Wait()
	return handlerErr, nil
}
