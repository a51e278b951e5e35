package queue

import "time"

// ListParams filters fenceq.ListJobs and the bulk actions (fenceq.RetryJobs, ...); empty
// fields match everything.
type ListParams struct {
	State State
	Queue string
	Kind  string
	// Tag keeps the jobs carrying this tag.
	Tag string
	// UnknownKinds keeps the jobs waiting to run (available, scheduled, retryable) that
	// no live worker can run: none of the workers serving the job's queue that
	// heartbeated within LiveWithin has a handler for its kind.
	UnknownKinds bool
	// LiveWithin is how recent a worker's heartbeat must be for UnknownKinds to count it.
	// Defaults to DefaultLiveWithin.
	LiveWithin time.Duration
	// Args, when set, keeps jobs whose JSON args contain it as text, case-insensitively
	// (at most MaxArgsSearchLen bytes).
	Args string
	// BeforeID pages backwards (keyset): only jobs with a smaller id.
	BeforeID int64
	// Limit defaults to 100.
	Limit int
	// ScanLimit, when positive, bounds how many jobs fenceq.ListJobs examines, newest
	// first from BeforeID, to apply a filter that no index serves (queue, kind, args,
	// and every state but running): a page then costs the same however rare the matches
	// are, and JobPage.Next continues the search below the jobs examined. Zero examines
	// as many as it takes. The bulk actions ignore it.
	ScanLimit int
}

// DefaultLiveWithin is the default of ListParams.LiveWithin: a few heartbeat intervals of
// a worker with the default lease.
const DefaultLiveWithin = 2 * time.Minute

// MaxArgsSearchLen bounds ListParams.Args.
const MaxArgsSearchLen = 200

// JobPage is one page of fenceq.ListJobs, newest first.
type JobPage struct {
	Jobs []*JobRow `json:"jobs"`
	// Next is the BeforeID of the next, older page; 0 when no older job can match.
	Next int64 `json:"next"`
	// Searched is true when the page holds fewer jobs than its limit because it
	// examined ScanLimit jobs: older jobs were not looked at yet and Next continues
	// there.
	Searched bool `json:"searched"`
}

// QueueInfo is one queue: its settings and job counts by state.
type QueueInfo struct {
	Name   string          `json:"name"`
	Paused bool            `json:"paused"`
	Counts map[State]int64 `json:"counts"`
}

// WorkerInfo is one row of fenceq_workers plus what the database derives from it.
type WorkerInfo struct {
	ID     string   `json:"id"`
	Host   string   `json:"host"`
	PID    int      `json:"pid"`
	Queues []string `json:"queues"`
	// Kinds are the job kinds the worker has handlers for: the only ones it claims.
	Kinds       []string  `json:"kinds"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	// HeartbeatAge is now() - heartbeat_at by the database's clock.
	HeartbeatAge time.Duration `json:"heartbeat_age"`
	RunningJobs  int64         `json:"running_jobs"`
}
