package store

import (
	"slices"
	"strings"

	"github.com/fenceq/fenceq/queue"
)

// The state lists come from package queue, which defines them once; the engine adds the
// two lists that only its statements need. A state's position in queue.JobStates is also
// its bit in a unique_states mask (see StateMask), stored in job rows and read by the SQL
// function fenceq_state_in_mask of migration 000012.
var (
	jobStates        = queue.JobStates()
	unfinishedStates = queue.UnfinishedStates()
	finalStates      = queue.FinalStates()
	// dueStates wait for run_at and are promoted to available when it passes.
	dueStates = []queue.State{queue.StateScheduled, queue.StateRetryable}
	// waitingStates are the unfinished states of a job nobody holds: those of a job that
	// waits for a worker that can run it.
	waitingStates = []queue.State{queue.StateAvailable, queue.StateScheduled, queue.StateRetryable}
)

// StateMask is a set of job states as stored in fenceq_jobs.unique_states: bit i stands
// for the i-th state of JobStates, except pending, which shares available's bit (a
// pending job holds its key exactly when an available one would).
type StateMask int16

// stateBit returns the bit of s in a StateMask, or -1 for an invalid state.
func stateBit(s queue.State) int {
	if s == queue.StatePending {
		s = queue.StateAvailable
	}
	return slices.Index(jobStates[:], s)
}

// MaskOf returns the mask of the given states; invalid states are ignored.
func MaskOf(states ...queue.State) StateMask {
	var m StateMask
	for _, s := range states {
		if i := stateBit(s); i >= 0 {
			m |= 1 << i
		}
	}
	return m
}

// Has reports whether the mask holds s.
func (m StateMask) Has(s queue.State) bool {
	i := stateBit(s)
	return i >= 0 && m&(1<<i) != 0
}

// States returns the states of the mask, in the order of JobStates.
func (m StateMask) States() []queue.State {
	var out []queue.State
	for _, s := range jobStates {
		if m.Has(s) {
			out = append(out, s)
		}
	}
	return out
}

// unfinishedMask is the unique_states of a job whose uniqueness lasts while it is
// unfinished: what a plain unique key means.
var unfinishedMask = MaskOf(unfinishedStates[:]...)

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

	sqlAvailable = sqlLit(queue.StateAvailable)
	sqlScheduled = sqlLit(queue.StateScheduled)
	sqlRunning   = sqlLit(queue.StateRunning)
	sqlRetryable = sqlLit(queue.StateRetryable)
	sqlCompleted = sqlLit(queue.StateCompleted)
	sqlDiscarded = sqlLit(queue.StateDiscarded)
	sqlCancelled = sqlLit(queue.StateCancelled)

	sqlEventRevoked       = sqlLit(queue.EventRevoked)
	sqlEventStaleWrite    = sqlLit(queue.EventStaleWriteRejected)
	sqlEventHolderAlive   = sqlLit(queue.EventExpiredHolderAlive)
	sqlEventHeartbeatLost = sqlLit(queue.EventHeartbeatLost)
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
