package fenceq

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/fenceq/fenceq/queue"
)

// ErrUnknownQueue is returned by RemoveQueue and SetQueueConcurrency for a queue the
// worker does not serve.
var ErrUnknownQueue = errors.New("queue not served by this worker")

// AddQueue starts serving a queue; MaxWorkers defaults to 10. On a running worker it
// first records the queue in the worker's fenceq_workers row, then starts claiming from
// it; before Start it adds the queue to those Start serves. It fails for an invalid
// name, a queue already served, or a worker that is starting or stopped.
func (w *Worker) AddQueue(ctx context.Context, name string, qc QueueConfig) error {
	if err := queue.ValidateQueue(name); err != nil {
		return fmt.Errorf("add queue: %w", err)
	}
	if qc.MaxWorkers == 0 {
		qc.MaxWorkers = 10
	}
	if qc.MaxWorkers < 1 {
		return fmt.Errorf("add queue %q: MaxWorkers: %d must be at least 1", name, qc.MaxWorkers)
	}
	w.regMu.Lock()
	defer w.regMu.Unlock()
	w.mu.Lock()
	if err := w.changeableLocked("add queue " + name); err != nil {
		w.mu.Unlock()
		return err
	}
	if _, ok := w.queues[name]; ok {
		w.mu.Unlock()
		return fmt.Errorf("add queue %q: already served", name)
	}
	if w.state == stateNew {
		w.queues[name] = &queueState{name: name, max: qc.MaxWorkers}
		w.reorderLocked()
		w.cfg.Queues[name] = qc
		w.mu.Unlock()
		return nil
	}
	names := append(w.queueNamesLocked(), name)
	w.mu.Unlock()
	// The row first: a queue is never worked without being listed.
	if err := w.writeRow(ctx, names); err != nil {
		return fmt.Errorf("add queue %q: %w", name, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.changeableLocked("add queue " + name); err != nil {
		return err // Stop began meanwhile; its deregistration removes the row
	}
	w.queues[name] = &queueState{name: name, max: qc.MaxWorkers, dirty: true}
	w.reorderLocked()
	w.cfg.Queues[name] = qc
	w.wakeClaims()
	w.log.Info("queue added", "queue", name, "max_workers", qc.MaxWorkers)
	return nil
}

// RemoveQueue stops serving a queue: it waits (until ctx is done) for a claim from the
// queue in flight to end, after which none starts, then records the change in the worker's
// fenceq_workers row. The queue's running jobs are not interrupted: they finish, and
// their leases are renewed until they do. Before Start it only takes the queue out of
// those Start serves.
func (w *Worker) RemoveQueue(ctx context.Context, name string) error {
	w.regMu.Lock()
	defer w.regMu.Unlock()
	w.mu.Lock()
	if err := w.changeableLocked("remove queue " + name); err != nil {
		w.mu.Unlock()
		return err
	}
	if _, ok := w.queues[name]; !ok {
		w.mu.Unlock()
		return fmt.Errorf("remove queue %q: %w", name, ErrUnknownQueue)
	}
	delete(w.queues, name)
	w.reorderLocked()
	delete(w.cfg.Queues, name)
	started := w.state != stateNew
	names := w.queueNamesLocked()
	w.mu.Unlock()
	if !started {
		return nil
	}
	// A claim round that began before the queue left the map may still claim from it;
	// the rounds after it do not.
	select {
	case w.inRound <- struct{}{}:
		<-w.inRound
	case <-ctx.Done():
		return fmt.Errorf("remove queue %q: waiting for the claim in flight: %w", name, ctx.Err())
	}
	if err := w.writeRow(ctx, names); err != nil {
		w.rowStale.Store(true) // the next heartbeat writes it again
		return fmt.Errorf("remove queue %q: claiming stopped, but recording it failed: %w", name, err)
	}
	w.log.Info("queue removed", "queue", name)
	return nil
}

// SetQueueConcurrency changes how many jobs of a served queue run at once. It takes
// effect at the queue's next claim, which it triggers: more slots are filled at once,
// and with fewer, running jobs finish and no new one starts until the queue is below the
// new limit.
func (w *Worker) SetQueueConcurrency(name string, maxWorkers int) error {
	if maxWorkers < 1 {
		return fmt.Errorf("set concurrency of queue %q: %d must be at least 1", name, maxWorkers)
	}
	w.mu.Lock()
	qs, ok := w.queues[name]
	if !ok {
		w.mu.Unlock()
		return fmt.Errorf("set concurrency of queue %q: %w", name, ErrUnknownQueue)
	}
	qs.max, qs.dirty = maxWorkers, true
	w.cfg.Queues[name] = QueueConfig{MaxWorkers: maxWorkers}
	w.mu.Unlock()
	w.wakeClaims()
	return nil
}

// Queues returns the names of the queues the worker serves now, sorted.
func (w *Worker) Queues() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.queueNamesLocked()
}

// changeableLocked refuses changes while Start runs and once Stop began. w.mu must be
// held.
func (w *Worker) changeableLocked(what string) error {
	switch w.state {
	case stateStarting:
		return fmt.Errorf("%s: Start has not returned yet", what)
	case stateStopping, stateStopped:
		return fmt.Errorf("%s: worker stopped", what)
	}
	return nil
}

// writeRow records queues (sorted) and the kinds in the worker's fenceq_workers row,
// unless Stop began (its deregistration, which also takes w.regMu, removes the row).
// w.regMu must be held.
func (w *Worker) writeRow(ctx context.Context, queues []string) error {
	w.mu.Lock()
	stopping := w.state == stateStopping || w.state == stateStopped
	w.mu.Unlock()
	if stopping {
		return nil
	}
	slices.Sort(queues)
	wctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
	defer cancel()
	return w.registerQueues(wctx, queues)
}
