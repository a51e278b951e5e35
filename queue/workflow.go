package queue

import (
	"encoding/json"
	"time"
)

// Workflow kinds: what a row of fenceq_workflows names.
const (
	// WorkflowKindWorkflow is a set of named tasks with dependencies.
	WorkflowKindWorkflow = "workflow"
	// WorkflowKindBatch is a group of jobs with a callback task that runs once they
	// have all finished.
	WorkflowKindBatch = "batch"
)

// Workflow is a workflow or a batch as stored: its row of fenceq_workflows and, from
// GetWorkflow, its tasks.
type Workflow struct {
	ID int64 `json:"id"`
	// Name is the name given at enqueue; names need not be unique.
	Name string `json:"name"`
	// Kind is WorkflowKindWorkflow or WorkflowKindBatch.
	Kind      string    `json:"kind"`
	CreatedAt time.Time `json:"created_at"`
	// States counts the workflow's tasks by state.
	States map[State]int `json:"states"`
	// Tasks are the workflow's tasks in the order they were enqueued (GetWorkflow only).
	Tasks []WorkflowTask `json:"tasks,omitempty"`
}

// Finished reports whether every task of the workflow has reached a final state.
func (w *Workflow) Finished() bool {
	for s, n := range w.States {
		if n > 0 && !s.Final() {
			return false
		}
	}
	return true
}

// WorkflowTask is one task of a workflow: a job and its dependencies.
type WorkflowTask struct {
	// Name is the task's name in its workflow (empty for a batch's members).
	Name  string `json:"name,omitempty"`
	JobID int64  `json:"job_id"`
	Kind  string `json:"kind"`
	Queue string `json:"queue"`
	State State  `json:"state"`
	// DepsLeft is how many of its dependencies are not done yet.
	DepsLeft int `json:"deps_left"`
	// BlockedBy is the dependency whose discard or cancel cancelled the task (0 for none).
	BlockedBy   int64      `json:"blocked_by,omitempty"`
	AttemptedAt *time.Time `json:"attempted_at,omitempty"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	// DependsOn are the jobs the task runs after.
	DependsOn []TaskDep `json:"depends_on,omitempty"`
}

// TaskDep is one dependency of a job.
type TaskDep struct {
	JobID int64 `json:"job_id"`
	// Task is the dependency's name in the same workflow (empty for a job outside it).
	Task string `json:"task,omitempty"`
	// Tolerate: the dependency counts as done even when it is discarded or cancelled.
	Tolerate bool `json:"tolerate,omitempty"`
	// Done: it counts as done for the dependent (it completed, or ended and is
	// tolerated).
	Done bool `json:"done"`
}

// WorkflowListParams filters ListWorkflows. The zero value lists the newest 100.
type WorkflowListParams struct {
	// Kind is WorkflowKindWorkflow, WorkflowKindBatch, or empty for both.
	Kind string
	// BeforeID lists only workflows with a smaller id (0: from the newest).
	BeforeID int64
	// Limit defaults to 100.
	Limit int
}

// SignalResult is what sending a signal did.
type SignalResult string

// Signal results.
const (
	// SignalDelivered: the job was waiting for the signal and was woken by it.
	SignalDelivered SignalResult = "delivered"
	// SignalKept: the signal is kept for the job, which is not waiting for it now; a
	// later wait for it ends at once.
	SignalKept SignalResult = "kept"
	// SignalDuplicate: a signal of that name was already sent to the job; nothing
	// changed (the first one's payload stands).
	SignalDuplicate SignalResult = "duplicate"
)

// Wait is a job's latest wait, for a signal or a timer (fenceq_job_waits).
type Wait struct {
	// Signal is the name waited for; empty for a timer.
	Signal string `json:"signal,omitempty"`
	// Gen is the lease generation of the attempt that waited.
	Gen int64 `json:"lease_gen"`
	// WaitedAt is when the wait began, by the database's clock.
	WaitedAt time.Time `json:"waited_at"`
	// Deadline is when the wait ends without its signal (nil: never).
	Deadline *time.Time `json:"deadline,omitempty"`
}

// Signal is a signal sent to a job (fenceq_signals).
type Signal struct {
	JobID   int64           `json:"job_id"`
	Name    string          `json:"name"`
	Payload json.RawMessage `json:"payload,omitempty"`
	SentAt  time.Time       `json:"sent_at"`
	// DeliveredAt is when it ended a wait of the job (nil: not yet).
	DeliveredAt *time.Time `json:"delivered_at,omitempty"`
	// DeliveredGen is the lease generation of the attempt whose wait it ended.
	DeliveredGen *int64 `json:"delivered_gen,omitempty"`
}

// BatchCounts are the final states of a batch's members, recorded in its callback's
// metadata under "batch" when the last member finished.
type BatchCounts struct {
	// ID is the batch's id (fenceq_workflows).
	ID        int64 `json:"id"`
	Completed int   `json:"completed"`
	Discarded int   `json:"discarded"`
	Cancelled int   `json:"cancelled"`
}
