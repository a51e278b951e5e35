package fenceq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/fenceq/fenceq/queue"
)

// RecordOutput records v, encoded as JSON, as the output of the running job whose
// handler ctx belongs to (or a context derived from it). The output is written to the
// job's row (fenceq_jobs.output, queue.JobRow.Output, shown by `fenceq jobs show`) by the
// job's completion, in the same fenced statement or transaction: the batched completion
// after the handler returns nil, or Job.Commit's transaction (RecordOutput may be
// called inside its function). So it is stored if and only if the job completes under
// its lease — not when the attempt fails, nor when the lease was lost.
//
// A later call replaces an earlier one; a nil v (JSON null) records no output. An
// encoding larger than queue.MaxOutputBytes is a *queue.ValidationError naming "output" (matching
// queue.ErrInvalid) and leaves the previous output in place, and so is an encoding
// jsonb cannot store (a string holding NUL). RecordOutput also fails when v
// does not encode, when ctx is not a running job's, and once the job can no longer
// take output: after its Job.Commit succeeded, or after its handler returned.
func RecordOutput(ctx context.Context, v any) error {
	e, _ := ctx.Value(executionKey).(*execution)
	if e == nil {
		return errors.New("record output: ctx is not the context of a running job's handler")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("record output of job %d: %w", e.lease.JobID, err)
	}
	if len(b) > queue.MaxOutputBytes {
		return fmt.Errorf("record output of job %d: %w", e.lease.JobID, &queue.ValidationError{Field: "output",
			Reason: fmt.Sprintf("%d bytes of JSON, over the limit of %d (MaxOutputBytes)", len(b), queue.MaxOutputBytes)})
	}
	// What jsonb cannot store (a NUL in a string) fails here, in the handler, rather
	// than the job's completion.
	if err := queue.ValidateOutput(b); err != nil {
		return fmt.Errorf("record output of job %d: %w", e.lease.JobID, err)
	}
	if string(b) == "null" {
		b = nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.committed:
		return fmt.Errorf("record output of job %d: the job was already completed by Job.Commit; record it before or inside Commit", e.lease.JobID)
	case e.sealed:
		return fmt.Errorf("record output of job %d: the handler has returned", e.lease.JobID)
	}
	e.output = b
	return nil
}

// recordedOutput returns the output recorded so far, for Job.Commit's completion.
func (e *execution) recordedOutput() []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.output
}
