package fenceq

import (
	"fmt"
	"time"
)

// retryAfter returns the FailParams fields that say when a failed job runs again: the
// kind's NextRetry when it names an instant, else the kind's queue.Backoff, else the worker's.
//
// NextRetry's instant becomes a delay from the row's attempted_at, which the database set
// at the claim, and the database adds it to that same attempted_at (never earlier than
// its now()): an instant computed from the row's times lands on that instant by the
// database's clock, and no time read on the worker takes part.
func (e *execution) retryAfter() (backoff time.Duration, sinceAttempted bool) {
	w := e.w
	b := w.cfg.Backoff
	if e.handler != nil && e.handler.opts.Backoff != nil {
		b = *e.handler.opts.Backoff
	}
	if e.handler != nil && e.handler.opts.NextRetry != nil && e.row.AttemptedAt != nil {
		if at, err := e.nextRetry(); err != nil {
			w.log.Error("NextRetry panicked; retrying with backoff", "job_id", e.lease.JobID, "kind", e.row.Kind, "err", err)
		} else if !at.IsZero() {
			return at.Sub(*e.row.AttemptedAt), true
		}
	}
	return b.Delay(e.row.Attempt), false
}

func (e *execution) nextRetry() (at time.Time, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return e.handler.opts.NextRetry(e.row), nil
}
