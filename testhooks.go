package fenceq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenceq/fenceq/internal/testhooks"
	"github.com/fenceq/fenceq/queue"
)

func init() { testhooks.RunClaimed = runClaimed }

// runClaimed is testhooks.RunClaimed, through which fenceqtest.Work runs one job with
// the worker's own execution: the same handler call, fenced Commit and WithLease,
// heartbeats and settling writes as a started worker, on the caller's goroutine. The
// worker must be fresh (never started): its execution is the only one it tracks.
func runClaimed(ctx context.Context, wa any, row *JobRow, sent time.Time) (handlerErr, err error) {
	w, ok := wa.(*Worker)
	if !ok || w == nil {
		return nil, fmt.Errorf("run claimed job: %T is not a *fenceq.Worker", wa)
	}
	if row == nil {
		return nil, errors.New("run claimed job: row is nil")
	}
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
		if derr := queue.DeregisterWorker(dctx, w.pool, w.cfg.ID); derr != nil {
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
