package fenceq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// Sentinel errors of Job.Signal; compare with errors.Is.
var (
	// ErrNoSignal: the job has received no signal of that name (and did not wait for
	// one).
	ErrNoSignal = errors.New("no such signal received")
	// ErrSignalTimeout: the job's latest wait was for that signal and ended without
	// it: its timeout passed (or an operator ran the job). A signal sent after that is
	// kept, and ends the job's next wait for it at once.
	ErrSignalTimeout = errors.New("the wait for the signal ended without it")
)

// waitError is a handler's request to wait (WaitForSignal, Sleep, SleepUntil).
type waitError struct {
	p   store.WaitParams
	bad error // the request is invalid: the attempt fails with this error
}

func (e *waitError) Error() string {
	switch {
	case e.bad != nil:
		return e.bad.Error()
	case e.p.Signal != "" && e.p.Timeout > 0:
		return fmt.Sprintf("wait for signal %s (timeout %s)", e.p.Signal, e.p.Timeout)
	case e.p.Signal != "":
		return fmt.Sprintf("wait for signal %s", e.p.Signal)
	case !e.p.Until.IsZero():
		return fmt.Sprintf("sleep until %s", e.p.Until.Format(time.RFC3339Nano))
	}
	return fmt.Sprintf("sleep %s", e.p.Timeout)
}

// WaitForSignal returns an error that, returned from a handler, ends the attempt with a
// wait for the signal name (SendSignal): the job gives its lease and its worker slot
// back and waits, pending, until the signal arrives or, with a timeout above 0, until
// timeout has passed by the database's clock (it waits scheduled then). The attempt does
// not count as a failure. When the job runs again, Job.Signal tells which ended the
// wait. A signal sent before the wait ends it at once. name is 1–64 letters, digits and
// "_ . : -"; an invalid name or a negative timeout fails the attempt instead.
func WaitForSignal(name string, timeout time.Duration) error {
	e := &waitError{p: store.WaitParams{Signal: name, Timeout: timeout}}
	if err := queue.ValidateName("signal", name, 64); err != nil {
		e.bad = err
	} else if timeout < 0 {
		e.bad = &queue.ValidationError{Field: "timeout", Reason: fmt.Sprintf("%s is negative", timeout)}
	}
	return e
}

// Sleep returns an error that, returned from a handler, ends the attempt with a durable
// timer: the job gives its lease and its worker slot back and waits, scheduled, until d
// has passed by the database's clock; then it runs again (Job.LastWait tells it that it
// slept). The attempt does not count as a failure. d must be positive.
func Sleep(d time.Duration) error {
	e := &waitError{p: store.WaitParams{Timeout: d}}
	if d <= 0 {
		e.bad = &queue.ValidationError{Field: "sleep", Reason: fmt.Sprintf("%s is not positive", d)}
	}
	return e
}

// SleepUntil is Sleep until the instant t; an instant already past runs the job again at
// once.
func SleepUntil(t time.Time) error {
	e := &waitError{p: store.WaitParams{Until: t}}
	if t.IsZero() {
		e.bad = &queue.ValidationError{Field: "sleep", Reason: "the zero time"}
	}
	return e
}

// SendSignal sends the signal name, with payload encoded as JSON (nil for none, at most
// 64 KiB), to job jobID, in db's transaction when db is a pgx.Tx. A signal is kept once
// per job and name: when the job waits for it (WaitForSignal), it is woken, once
// (queue.SignalDelivered); otherwise it is kept for the job's next wait for it
// (queue.SignalKept); a second send of the same name changes nothing
// (queue.SignalDuplicate, even once the job has finished, so that a sender may retry).
// A job that does not exist is queue.ErrNotFound; a finished one that never got the
// signal is queue.ErrWrongState. Concurrent sends, and a send racing the job's wait or its
// timeout, are decided by the database under the job's row lock: the job is woken at
// most once, and either the signal or the timeout ends a wait, never both.
func SendSignal(ctx context.Context, db queue.DBTX, jobID int64, name string, payload any) (queue.SignalResult, error) {
	var raw []byte
	if payload != nil {
		var err error
		if raw, err = json.Marshal(payload); err != nil {
			return "", fmt.Errorf("send signal %s to job %d: encode payload: %w", name, jobID, err)
		}
		if string(raw) == "null" {
			raw = nil
		}
	}
	return store.SendSignal(ctx, db, jobID, name, raw)
}

// Signal decodes into v the payload of the signal name sent to the job (v is left alone
// when it has none). It returns ErrSignalTimeout when the job's latest wait was for that
// signal and ended without it (the timeout won, even if the signal arrived since), and
// ErrNoSignal when the job has received none of that name.
func (j *Job[T]) Signal(ctx context.Context, name string, v any) error {
	st, err := store.JobSignal(ctx, j.exec.w.pool, j.ID, name)
	if err != nil {
		return err
	}
	delivered := st.Signal != nil && st.Signal.DeliveredAt != nil
	switch {
	case !delivered && st.Wait != nil && st.Wait.Signal == name:
		return fmt.Errorf("signal %s of job %d: %w", name, j.ID, ErrSignalTimeout)
	case st.Signal == nil:
		return fmt.Errorf("signal %s of job %d: %w", name, j.ID, ErrNoSignal)
	}
	if len(st.Signal.Payload) == 0 || v == nil {
		return nil
	}
	if err := json.Unmarshal(st.Signal.Payload, v); err != nil {
		return fmt.Errorf("decode signal %s of job %d: %w", name, j.ID, err)
	}
	return nil
}

// LastWait returns the job's latest wait (for a signal or a timer), or nil when it never
// waited: a handler that slept (Sleep) finds its sleep here when it runs again.
func (j *Job[T]) LastWait(ctx context.Context) (*queue.Wait, error) {
	st, err := store.JobSignal(ctx, j.exec.w.pool, j.ID, "")
	if err != nil {
		return nil, err
	}
	return st.Wait, nil
}

// ListSignals returns the signals sent to job jobID, by name, with their delivery.
func ListSignals(ctx context.Context, db queue.DBTX, jobID int64) ([]queue.Signal, error) {
	return store.ListSignals(ctx, db, jobID)
}
