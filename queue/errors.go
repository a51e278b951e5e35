package queue

import (
	"errors"
	"fmt"
)

// Sentinel errors. Compare with errors.Is.
var (
	// ErrLeaseLost means the lease named by (job id, lease generation) is no longer held:
	// the reaper revoked it, an operator requeued or cancelled the job, or the job already
	// reached another state. The database rejected the write; nothing was changed.
	ErrLeaseLost = errors.New("lease lost")
	// ErrNotFound means no row has the given id.
	ErrNotFound = errors.New("not found")
	// ErrInvalid is wrapped by every ValidationError.
	ErrInvalid = errors.New("invalid input")
	// ErrWrongState means an operator action does not apply to the job's current state.
	ErrWrongState = errors.New("job is in the wrong state for this action")
)

// ValidationError names the field that was wrong and why. It matches ErrInvalid.
type ValidationError struct {
	// Field names the input that was wrong, e.g. "queue" or "args".
	Field string
	// Reason says what was wrong with it.
	Reason string
}

// Error implements error: "invalid FIELD: REASON".
func (e *ValidationError) Error() string { return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason) }

// Is makes errors.Is(err, ErrInvalid) true for every ValidationError.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// ErrExists means a row with that name exists already.
var ErrExists = errors.New("already exists")

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
