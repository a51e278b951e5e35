package queue

import "slices"

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
	// StatePending: waits for its turn (a dependency, a sequence, a concurrency slot or a
	// signal) before it becomes available. No worker claims it; the database releases it.
	StatePending State = "pending"
)

// The state lists, defined once; code outside this package gets copies from the
// functions below.
//
// A state's position in jobStates is also its bit in a unique_states mask stored in job
// rows and read by the SQL function fenceq_state_in_mask of migration 000012: new states
// are appended, never inserted or reordered. StatePending has no bit of its own: a
// pending job holds its unique key exactly when an available one would (it shares
// available's bit, see migration 000015).
var (
	jobStates = [...]State{StateAvailable, StateScheduled, StateRunning, StateRetryable,
		StateCompleted, StateDiscarded, StateCancelled, StatePending}
	unfinishedStates = [...]State{StateAvailable, StateScheduled, StateRunning, StateRetryable, StatePending}
	finalStates      = [...]State{StateCompleted, StateDiscarded, StateCancelled}
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
