package fenceq

import (
	"context"
	"fmt"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// Outcome is how one attempt of a job ended, as reported to JobFinishedHook.
type Outcome string

// Outcomes.
const (
	OutcomeCompleted Outcome = "completed"
	OutcomeRetried   Outcome = "retried"
	OutcomeDiscarded Outcome = "discarded"
	OutcomeCancelled Outcome = "cancelled"
	OutcomeSnoozed   Outcome = "snoozed"
	// OutcomeWaiting: the handler returned WaitForSignal, Sleep or SleepUntil; the job
	// waits, holding no lease, and the attempt does not count as a failure.
	OutcomeWaiting   Outcome = "waiting"
	OutcomeLeaseLost Outcome = "lease_lost"
	OutcomeReleased  Outcome = "released"
	OutcomeUnknown   Outcome = "unknown"
)

// Hook observes a worker's lifecycle events, for metrics, tracing and logs. It is any
// value that implements one or more of these interfaces:
//
//   - JobStartedHook
//   - JobFinishedHook
//   - LeaseLostHook
//   - StaleWriteRejectedHook
//   - LeaseRevokedHook
//   - HeartbeatFailedHook
//   - PeriodicEnqueuedHook
//   - PeriodicSkippedHook
//
// Register it in Config.Hooks (NewWorker rejects a value that implements none of
// them). Hooks are called in the order given.
//
// Hook methods run on the worker's own goroutines (the claim loop, the completer, the
// heartbeat, the reaper, the periodic scheduler): they must be fast, must not block and must be safe for
// concurrent use. The job's context they get is the context the job's handler ran
// with, carrying the values middleware put in it (such as a tracing span); it may
// already be cancelled, so use it for its values, not for I/O.
type Hook any

// JobStartedHook is told when an attempt of a job starts: right after its claim, before
// middleware and handler run. job carries the attempt's lease (LeaseGen) and attempt
// number.
type JobStartedHook interface {
	JobStarted(ctx context.Context, job *queue.JobRow)
}

// JobFinishedHook is told once per attempt, when its outcome is settled: written under
// the lease, or known to be lost. For a job that completes, that is after its batched
// completion (or its Job.Commit) was written.
type JobFinishedHook interface {
	JobFinished(ctx context.Context, job *queue.JobRow, res AttemptResult)
}

// LeaseLostHook is told when a heartbeat finds the lease of a running job gone (revoked
// by the reaper or an operator); the job's context is cancelled with queue.ErrLeaseLost.
// holderAlive is true when this worker was still running the job after its lease had
// expired (it paused or stalled past its lease) and recorded the expired_holder_alive
// event itself, the reaper not having seen it alive.
type LeaseLostHook interface {
	LeaseLost(ctx context.Context, job *queue.JobRow, holderAlive bool)
}

// StaleWriteRejectedHook is told when the database rejected a write of this worker
// because the job's lease generation had moved on: op names the write ("commit",
// "complete", "with lease", "settle", "release").
type StaleWriteRejectedHook interface {
	StaleWriteRejected(ctx context.Context, job *queue.JobRow, op string)
}

// LeaseRevokedHook is told of each expired lease this worker's reaper revoked, whoever
// held it. ctx is the reaper's.
type LeaseRevokedHook interface {
	LeaseRevoked(ctx context.Context, r queue.Revocation)
}

// HeartbeatFailedHook is told when a heartbeat statement failed (the database was
// unreachable or slow). ctx is the heartbeat's.
type HeartbeatFailedHook interface {
	HeartbeatFailed(ctx context.Context, err error)
}

// PeriodicEnqueuedHook is told when a scheduling pass of this worker committed n jobs
// of the periodic schedule name. ctx is the pass's.
type PeriodicEnqueuedHook interface {
	PeriodicEnqueued(ctx context.Context, name string, n int)
}

// PeriodicSkippedHook is told when a scheduling pass of this worker committed, for the
// periodic schedule name, n slots skipped because a job of the schedule was unfinished
// (PeriodicOpts.NoOverlap). ctx is the pass's.
type PeriodicSkippedHook interface {
	PeriodicSkipped(ctx context.Context, name string, n int)
}

// AttemptResult is how one attempt ended, as JobFinishedHook is told.
type AttemptResult struct {
	Outcome Outcome
	// Err is the error behind the outcome: the handler's (or a middleware's) for
	// retried, discarded, cancelled and snoozed; for lease_lost an error matching
	// queue.ErrLeaseLost (the rejected write's, the handler's, or the cancellation's cause);
	// the failed write's for unknown; nil for completed and released.
	Err error
	// Duration runs from the claim to the settled outcome.
	Duration time.Duration
}

// hookSet holds a worker's hooks by event, sorted once by NewWorker, so that an event
// with no hook costs a loop over an empty slice.
type hookSet struct {
	started  []JobStartedHook
	finished []JobFinishedHook
	lost     []LeaseLostHook
	stale    []StaleWriteRejectedHook
	revoked  []LeaseRevokedHook
	hbFailed []HeartbeatFailedHook
	periodic []PeriodicEnqueuedHook
	skipped  []PeriodicSkippedHook
}

func newHookSet(hooks []Hook) (hookSet, error) {
	var s hookSet
	for i, h := range hooks {
		n := 0
		if x, ok := h.(JobStartedHook); ok {
			s.started = append(s.started, x)
			n++
		}
		if x, ok := h.(JobFinishedHook); ok {
			s.finished = append(s.finished, x)
			n++
		}
		if x, ok := h.(LeaseLostHook); ok {
			s.lost = append(s.lost, x)
			n++
		}
		if x, ok := h.(StaleWriteRejectedHook); ok {
			s.stale = append(s.stale, x)
			n++
		}
		if x, ok := h.(LeaseRevokedHook); ok {
			s.revoked = append(s.revoked, x)
			n++
		}
		if x, ok := h.(HeartbeatFailedHook); ok {
			s.hbFailed = append(s.hbFailed, x)
			n++
		}
		if x, ok := h.(PeriodicEnqueuedHook); ok {
			s.periodic = append(s.periodic, x)
			n++
		}
		if x, ok := h.(PeriodicSkippedHook); ok {
			s.skipped = append(s.skipped, x)
			n++
		}
		if n == 0 {
			return hookSet{}, fmt.Errorf("config: Hooks[%d]: %T implements none of the hook interfaces (JobStartedHook, JobFinishedHook, …)", i, h)
		}
	}
	return s, nil
}

func (s *hookSet) jobStarted(ctx context.Context, job *queue.JobRow) {
	for _, h := range s.started {
		h.JobStarted(ctx, job)
	}
}

func (s *hookSet) jobFinished(ctx context.Context, job *queue.JobRow, res AttemptResult) {
	for _, h := range s.finished {
		h.JobFinished(ctx, job, res)
	}
}

func (s *hookSet) leaseLost(ctx context.Context, job *queue.JobRow, holderAlive bool) {
	for _, h := range s.lost {
		h.LeaseLost(ctx, job, holderAlive)
	}
}

func (s *hookSet) staleWriteRejected(ctx context.Context, job *queue.JobRow, op string) {
	for _, h := range s.stale {
		h.StaleWriteRejected(ctx, job, op)
	}
}

func (s *hookSet) leaseRevoked(ctx context.Context, r queue.Revocation) {
	for _, h := range s.revoked {
		h.LeaseRevoked(ctx, r)
	}
}

func (s *hookSet) heartbeatFailed(ctx context.Context, err error) {
	for _, h := range s.hbFailed {
		h.HeartbeatFailed(ctx, err)
	}
}

func (s *hookSet) periodicEnqueued(ctx context.Context, name string, n int) {
	for _, h := range s.periodic {
		h.PeriodicEnqueued(ctx, name, n)
	}
}

func (s *hookSet) periodicSkipped(ctx context.Context, name string, n int) {
	for _, h := range s.skipped {
		h.PeriodicSkipped(ctx, name, n)
	}
}
