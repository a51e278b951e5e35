package queue

import (
	"slices"
	"strings"
)

// State is the state of a job row.
type State string

// Job states. See doc.go for the state machine.
const (
	StateAvailable State = "available" // ready to be claimed
	StateScheduled State = "scheduled" // waits for run_at
	StateRunning   State = "running"   // leased to a worker
	StateRetryable State = "retryable" // failed, waits for run_at to retry
	StateCompleted State = "completed" // final: succeeded
	StateDiscarded State = "discarded" // final: failed past max attempts, or discarded
	StateCancelled State = "cancelled" // final: cancelled by handler or operator
)

// The state lists, defined once. Statements get them from the SQL spellings below, and
// code outside this package from the functions that return copies.
//
// A state's position in jobStates is also its bit in a unique_states mask (see
// StateMask), stored in job rows and read by the SQL function fenceq_state_in_mask of
// migration 000012: new states are appended, never inserted or reordered.
var (
	jobStates = [...]State{StateAvailable, StateScheduled, StateRunning, StateRetryable,
		StateCompleted, StateDiscarded, StateCancelled}
	unfinishedStates = [...]State{StateAvailable, StateScheduled, StateRunning, StateRetryable}
	finalStates      = [...]State{StateCompleted, StateDiscarded, StateCancelled}
	// dueStates wait for run_at and are promoted to available when it passes.
	dueStates = [...]State{StateScheduled, StateRetryable}
	// waitingStates are the unfinished states of a job nobody holds: those of a job that
	// waits for a worker that can run it.
	waitingStates = [...]State{StateAvailable, StateScheduled, StateRetryable}
)

// JobStates returns every job state, in the order operators read them.
func JobStates() []State { return slices.Clone(jobStates[:]) }

// UnfinishedStates returns the states of a job that will still run or is running.
func UnfinishedStates() []State { return slices.Clone(unfinishedStates[:]) }

// FinalStates returns the states of a finished job.
func FinalStates() []State { return slices.Clone(finalStates[:]) }

// Final reports whether the state is final: the job will never run again unless an
// operator retries it.
func (s State) Final() bool { return slices.Contains(finalStates[:], s) }

// Valid reports whether s names a job state.
func (s State) Valid() bool { return slices.Contains(jobStates[:], s) }

// StateMask is a set of job states as stored in fenceq_jobs.unique_states: bit i stands
// for the i-th state of JobStates.
type StateMask int16

// MaskOf returns the mask of the given states; invalid states are ignored.
func MaskOf(states ...State) StateMask {
	var m StateMask
	for _, s := range states {
		if i := slices.Index(jobStates[:], s); i >= 0 {
			m |= 1 << i
		}
	}
	return m
}

// Has reports whether the mask holds s.
func (m StateMask) Has(s State) bool {
	i := slices.Index(jobStates[:], s)
	return i >= 0 && m&(1<<i) != 0
}

// States returns the states of the mask, in the order of JobStates.
func (m StateMask) States() []State {
	var out []State
	for i, s := range jobStates {
		if m&(1<<i) != 0 {
			out = append(out, s)
		}
	}
	return out
}

// unfinishedMask is the unique_states of a job whose uniqueness lasts while it is
// unfinished: what a plain unique key means.
var unfinishedMask = MaskOf(unfinishedStates[:]...)

// LeaseEventKind names what happened to a lease. The kinds are the contract of
// fenceq_lease_events.kind.
type LeaseEventKind string

// Lease event kinds.
const (
	// EventRevoked: the reaper or an operator took the lease away and bumped the generation.
	EventRevoked LeaseEventKind = "revoked"
	// EventStaleWriteRejected: a write under an old generation matched nothing.
	EventStaleWriteRejected LeaseEventKind = "stale_write_rejected"
	// EventExpiredHolderAlive: a lease expired while its holder process still heartbeated.
	EventExpiredHolderAlive LeaseEventKind = "expired_holder_alive"
	// EventHeartbeatLost: a holder's heartbeat found its lease gone.
	EventHeartbeatLost LeaseEventKind = "heartbeat_lost"
)

var leaseEventKinds = [...]LeaseEventKind{EventRevoked, EventStaleWriteRejected, EventExpiredHolderAlive, EventHeartbeatLost}

// LeaseEventKinds returns every lease event kind.
func LeaseEventKinds() []LeaseEventKind { return slices.Clone(leaseEventKinds[:]) }

// Details of the revoked events, which tell why a lease was revoked. A holder that finds
// its lease gone looks for detailExpired to tell an expiry (it was paused or stuck) from
// an operator's action.
const (
	detailExpired          = "lease expired"
	detailCancelledByAdmin = "cancelled by operator"
	detailRequeuedByAdmin  = "requeued by operator"
)

// Details of the other events: the reaper's note that a holder it revoked still
// heartbeats, and a holder's own records of a lease its heartbeat found gone.
const (
	detailHolderAlive    = "holder still heartbeats in fenceq_workers"
	detailHeartbeatLost  = "heartbeat found the lease gone"
	detailHolderWasAlive = "the holder was still running the job when its expired lease was revoked"
)

// SQL spellings of the vocabulary above. Statements name states literally where the
// planner must match them against a partial index's predicate (a parameter would not
// match), so they are rendered here from the constants, never typed again.
var (
	sqlUnfinished = sqlList(unfinishedStates[:])
	sqlFinal      = sqlList(finalStates[:])
	sqlDue        = sqlList(dueStates[:])
	sqlWaiting    = sqlList(waitingStates[:])

	sqlAvailable = sqlLit(StateAvailable)
	sqlScheduled = sqlLit(StateScheduled)
	sqlRunning   = sqlLit(StateRunning)
	sqlRetryable = sqlLit(StateRetryable)
	sqlCompleted = sqlLit(StateCompleted)
	sqlDiscarded = sqlLit(StateDiscarded)
	sqlCancelled = sqlLit(StateCancelled)

	sqlEventRevoked       = sqlLit(EventRevoked)
	sqlEventStaleWrite    = sqlLit(EventStaleWriteRejected)
	sqlEventHolderAlive   = sqlLit(EventExpiredHolderAlive)
	sqlEventHeartbeatLost = sqlLit(EventHeartbeatLost)
)

// sqlLit renders a vocabulary word as an SQL string literal.
func sqlLit[T ~string](v T) string { return "'" + strings.ReplaceAll(string(v), "'", "''") + "'" }

// sqlList renders words as a parenthesized SQL list: ('a', 'b').
func sqlList[T ~string](vs []T) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = sqlLit(v)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// MissedPolicy says what a periodic schedule does with the slots that fell due while
// every worker was down. The policies are the contract of fenceq_periodic.missed.
type MissedPolicy string

// Missed-slot policies.
const (
	// MissedSkip enqueues none of them: the schedule resumes at its next slot.
	MissedSkip MissedPolicy = "skip"
	// MissedOnce enqueues one job, for the newest of them.
	MissedOnce MissedPolicy = "once"
)

var missedPolicies = [...]MissedPolicy{MissedSkip, MissedOnce}

// MissedPolicies returns every missed-slot policy.
func MissedPolicies() []MissedPolicy { return slices.Clone(missedPolicies[:]) }

// Valid reports whether p names a policy.
func (p MissedPolicy) Valid() bool { return slices.Contains(missedPolicies[:], p) }

// PeriodicSource says where a periodic schedule was defined: the contract of
// fenceq_periodic.source.
type PeriodicSource string

// Periodic schedule sources.
const (
	// SourceCode: a worker's configuration defines it and upserts it at every start.
	SourceCode PeriodicSource = "code"
	// SourceCLI: an operator added it (fenceq periodic add).
	SourceCLI PeriodicSource = "cli"
)

var periodicSources = [...]PeriodicSource{SourceCode, SourceCLI}

// Valid reports whether s names a source.
func (s PeriodicSource) Valid() bool { return slices.Contains(periodicSources[:], s) }
