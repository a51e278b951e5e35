package fenceq

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors; compare with errors.Is.
var (
	// ErrLeaseDeadline is the cause of a job context cancelled because the worker could
	// not confirm a lease renewal before its local deadline (the database was unreachable):
	// it can no longer know that it holds the lease.
	ErrLeaseDeadline = errors.New("local lease deadline passed without a confirmed renewal")
	// ErrShutdown is the cause of a job context cancelled because the worker is stopping
	// and the shutdown deadline passed; the job's lease is released.
	ErrShutdown = errors.New("worker shutting down")
	// ErrJobTimeout is the cause of a job context cancelled by the kind's timeout.
	ErrJobTimeout = errors.New("job timeout")
)

// JobSnooze returns an error that, returned from a handler, puts the job back to run
// again after d without using up an attempt.
func JobSnooze(d time.Duration) error { return &snoozeError{d: d} }

// JobCancel returns an error that, returned from a handler, finishes the job as cancelled:
// no retry.
func JobCancel(err error) error { return &cancelError{err: err} }

// JobDiscard returns an error that, returned from a handler, finishes the job as
// discarded at once: a permanent failure that no retry can fix.
func JobDiscard(err error) error { return &discardError{err: err} }

type snoozeError struct{ d time.Duration }

func (e *snoozeError) Error() string { return fmt.Sprintf("snooze %s", e.d) }

type cancelError struct{ err error }

func (e *cancelError) Error() string { return fmt.Sprintf("cancel: %v", e.err) }
func (e *cancelError) Unwrap() error { return e.err }

type discardError struct{ err error }

func (e *discardError) Error() string { return fmt.Sprintf("discard: %v", e.err) }
func (e *discardError) Unwrap() error { return e.err }

// PanicError is the failure recorded when a handler panics.
type PanicError struct {
	// Value is what the handler passed to panic.
	Value any
	// Stack is the goroutine's stack at the panic, stored with the attempt's error.
	Stack string
}

// Error implements error: "panic: " and the panic value.
func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }
